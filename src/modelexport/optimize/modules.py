"""Which nodes a module glob means: ``--exclude-modules`` patterns matched against hierarchy tags.

A pattern matches a module and everything below it; a pattern that matches nothing is an error that
names some of the model's modules. Used by every quantizer (int8 modes and weight-only) and by the
package transform, which hands each graph the patterns that match a module in it.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..hierarchy.tags import node_tag
from ..onnxfile import load_structure

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GEMM_PARTS",
    "excluded_nodes",
    "module_hits",
    "no_module_error",
    "package_exclusions",
    "tagged_names",
]

#: The names ORT's operator-format quantizer gives the parts of a ``Gemm`` it rewrites.
GEMM_PARTS = ("_MatMul", "_Add", "_Transpose")


def tagged_names(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tag or "", node name) of every node of the main graph."""
    return [(node_tag(n) or "", n.name) for n in model.graph.node]


def module_hits(tags: list[tuple[str, str]], pattern: str) -> list[str]:
    """Names of the nodes whose tag is the module ``pattern`` matches or below it."""
    return [
        name
        for tag, name in tags
        if tag and (fnmatch.fnmatchcase(tag, pattern) or fnmatch.fnmatchcase(tag, pattern + "/*"))
    ]


def no_module_error(pattern: str, tags: list[tuple[str, str]]) -> ConfigError:
    known = sorted({t for t, _ in tags if t}, key=len)[:8]
    return ConfigError(
        f"--exclude-modules {pattern!r} matches no module; modules look like: {', '.join(known)}",
        hint="patterns are globs on hierarchy tags, e.g. '*/BertEmbeddings*' or '*LayerNorm*'",
    )


def excluded_nodes(model: onnx.ModelProto, patterns: tuple[str, ...]) -> list[str]:
    """Names of nodes whose tag matches a glob in ``patterns`` (a module and everything below it).

    A pattern that matches no node is an error that lists some of the model's modules.
    """
    chosen: list[str] = []
    tags = tagged_names(model)
    for pattern in patterns:
        hits = module_hits(tags, pattern)
        if not hits:
            raise no_module_error(pattern, tags)
        chosen.extend(h for h in hits if h and h not in chosen)
    gemms = {n.name for n in model.graph.node if n.op_type == "Gemm"}
    # ORT's operator-format quantizer rewrites Gemm into <name>_MatMul + <name>_Add before it
    # applies nodes_to_exclude: exclude those names too, or an excluded Gemm is quantized anyway.
    return chosen + [f"{g}{suffix}" for g in chosen if g in gemms for suffix in GEMM_PARTS]


def package_exclusions(graphs: dict[str, Path], patterns: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Per graph file name, the ``--exclude-modules`` patterns that match a module in it (a decoder's module is
    in the decoders only); a pattern no graph matches is an error."""
    tags = {file.name: tagged_names(load_structure(file)) for file in graphs.values()}
    per = {name: tuple(p for p in patterns if module_hits(t, p)) for name, t in tags.items()}
    for pattern in patterns:
        if not any(pattern in found for found in per.values()):
            raise no_module_error(pattern, [t for graph in tags.values() for t in graph])
    return per
