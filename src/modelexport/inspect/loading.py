"""Open an ONNX file for inspection, with one clear error for each way a file can be unusable.

Missing, not ONNX, truncated and empty files all raise :class:`OnnxFileError` naming the file and
the problem. The hierarchy sidecar (``<stem>_hierarchy.json`` beside the model, as ``export`` writes
it) is optional: every command also works from the node tags alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import MetadataError, OnnxFileError
from .graph import GraphIndex

__all__ = ["TaggedModel", "load_tagged_model", "load_sidecar", "sidecar_path_for"]

PathLike = str | os.PathLike[str]


@dataclass
class TaggedModel:
    """A loaded model, where it came from, and its sidecar when there is one."""

    proto: Any
    path: Path | None = None
    sidecar: dict[str, Any] | None = None
    sidecar_path: Path | None = None
    #: False when loaded for statistics only: initializers carry names, dims and dtypes but no values.
    has_weights: bool = True

    @cached_property
    def index(self) -> GraphIndex:
        return GraphIndex.build(self.proto)

    @property
    def name(self) -> str:
        return str(self.path) if self.path else "<model>"

    @property
    def opset(self) -> int:
        return next((o.version for o in self.proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def sidecar_path_for(model_path: Path) -> Path:
    """``dir/model.onnx`` -> ``dir/model_hierarchy.json``."""
    return model_path.with_name(f"{model_path.stem}_hierarchy.json")


def load_sidecar(path: PathLike) -> dict[str, Any]:
    """Read a ``model_hierarchy.json``; MetadataError when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise OnnxFileError(
            f"hierarchy file not found: {path}", hint="pass the model_hierarchy.json written by export"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetadataError(
            f"{path} is not valid JSON: {exc}", hint="re-export, or drop the broken sidecar"
        ) from exc
    if not isinstance(data, dict) or "nodes" not in data or "tags" not in data:
        raise MetadataError(f"{path} is not a modelexport hierarchy file (no 'nodes'/'tags')")
    return data


def _resolve_path(path: PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        candidates = sorted(path.glob("*.onnx"))
        if (path / "model.onnx").is_file():
            return path / "model.onnx"
        if len(candidates) == 1:
            return candidates[0]
        raise OnnxFileError(f"{path} is a folder with {len(candidates)} .onnx files; name the file to use")
    if not path.exists():
        raise OnnxFileError(
            f"ONNX model not found: {path}", hint="check the path (an export folder holds model.onnx)"
        )
    if path.stat().st_size == 0:
        raise OnnxFileError(f"{path} is empty (0 bytes)")
    return path


def _parse(path: Path, weights: bool) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    from ._wire import load_structure

    proto = None
    if not weights:
        try:
            proto = load_structure(path)
        except (ValueError, IndexError, DecodeError, OSError):  # let protobuf name the problem below
            proto = None
    try:
        proto = proto if proto is not None else onnx.load(str(path), load_external_data=weights)
    except DecodeError as exc:
        raise OnnxFileError(f"{path} is not an ONNX model or is truncated/corrupted ({exc})") from exc
    except (FileNotFoundError, OSError, onnx.checker.ValidationError) as exc:
        raise OnnxFileError(
            f"cannot read {path} or its external data: {exc}",
            hint="keep the model's external data file(s) beside it, under the names recorded in the model",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - onnx raises assorted types for damaged files
        raise OnnxFileError(f"{path} cannot be parsed as ONNX: {type(exc).__name__}: {exc}") from exc
    problems = []
    if not proto.ir_version:
        problems.append("no IR version")
    if not proto.HasField("graph") or not proto.graph.output:
        problems.append("no graph outputs")
    if not proto.opset_import:
        problems.append("no opset imports")
    if problems:
        raise OnnxFileError(f"{path} is not a valid ONNX model or is truncated ({', '.join(problems)})")
    return proto


def load_tagged_model(
    model: PathLike | Any,
    *,
    hierarchy: PathLike | dict[str, Any] | bool | None = None,
    weights: bool = True,
) -> TaggedModel:
    """Load a model (path, export folder or ``ModelProto``) and its sidecar.

    ``hierarchy``: a sidecar dict or path; ``None`` looks beside the model; ``False`` ignores it.
    ``weights=False`` reads the structure only (no tensor values, external data not loaded): the
    fast path for statistics on large models.
    """
    if hasattr(model, "graph"):
        sidecar = hierarchy if isinstance(hierarchy, dict) else None
        if isinstance(hierarchy, (str, os.PathLike)):
            sidecar = load_sidecar(hierarchy)
        return TaggedModel(model, None, sidecar, None)
    path = _resolve_path(model)
    proto = _parse(path, weights)
    if hierarchy is False:
        return TaggedModel(proto, path, has_weights=weights)
    if isinstance(hierarchy, dict):
        return TaggedModel(proto, path, hierarchy, has_weights=weights)
    side = Path(hierarchy) if hierarchy else sidecar_path_for(path)
    if hierarchy is None and not side.is_file():
        return TaggedModel(proto, path, has_weights=weights)
    return TaggedModel(proto, path, load_sidecar(side), side, has_weights=weights)
