"""Where each exporter records the module that produced a node, mapped onto the module tree.

- dynamo: node ``metadata_props['pkg.torch.onnx.name_scopes']``, a list of module paths ending
  with the FX node name.
- torchscript: scoped node names, ``/encoder/layer.0/attention/self/query/MatMul``; a module called
  again shows as ``fc_1``.

A reader returns the deepest module path it can resolve, or ``None`` (the node is then tagged by
propagation).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

from .._registry import Registry

__all__ = ["SCOPE_READERS", "module_path_for", "scope_counts"]

_CALL_SUFFIX = re.compile(r"^(.*?)(?:_\d+|@\d+)$")
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"

ScopeReader = Callable[["onnx.NodeProto", set[str]], str | None]
SCOPE_READERS: Registry[ScopeReader] = Registry("exporter")


def _resolve(candidate: str, paths: set[str]) -> str | None:
    """``candidate`` itself, or with a repeated-call suffix (``_1``/``@1``) stripped from any segment."""
    if candidate in paths:
        return candidate
    parts = candidate.split(".")
    stripped = [(_CALL_SUFFIX.match(p).group(1) if _CALL_SUFFIX.match(p) else p) for p in parts]  # type: ignore[union-attr]
    joined = ".".join(stripped)
    return joined if joined in paths else None


@SCOPE_READERS.register("dynamo")
def _dynamo_scope(node: onnx.NodeProto, paths: set[str]) -> str | None:
    raw = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES_KEY), None)
    if raw is None:
        return None
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2:
        return None
    for candidate in reversed(scopes[:-1]):  # last entry is the FX node, not a module
        resolved = _resolve(str(candidate), paths)
        if resolved is not None:
            return resolved
    return None


@SCOPE_READERS.register("torchscript")
def _torchscript_scope(node: onnx.NodeProto, paths: set[str]) -> str | None:
    name = node.name or ""
    if not name.startswith("/"):
        return None
    segments = name[1:].split("/")[:-1]  # last segment is the op name
    current = ""
    for seg in segments:
        resolved = _child(current, seg, paths)
        if resolved is None:
            break
        current = resolved
    return current


def _child(current: str, seg: str, paths: set[str]) -> str | None:
    """A scope segment is relative to its parent scope (``layer.0`` under ``encoder``) or, for
    children a container calls itself, the child's qualified name (``features.0`` under ``features``)."""
    for candidate in (f"{current}.{seg}" if current else seg, seg):
        resolved = _resolve(candidate, paths)
        if resolved is not None and (not current or resolved.startswith(current + ".")):
            return resolved
    return None


def module_path_for(exporter: str, node: onnx.NodeProto, paths: set[str]) -> str | None:
    return SCOPE_READERS[exporter](node, paths)


def scope_counts(model: onnx.ModelProto, exporter: str, paths: set[str]) -> Counter[str]:
    """How many of the graph's nodes each module path produced (nodes with a resolvable scope)."""
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        path = module_path_for(exporter, node, paths)
        if path is not None:
            counts[path] += 1
    return counts
