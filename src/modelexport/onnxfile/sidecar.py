"""The hierarchy sidecar (``<stem>_hierarchy.json`` beside the model): where it lives and how it is read.

The sidecar is optional (the tags live in the ONNX nodes): a missing one is ``None``. A present but
broken one is an error everywhere, never silently ignored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._io import read_json_object
from ..errors import MetadataError, OnnxFileError
from .inside import safe_join

__all__ = ["SIDECAR_SUFFIX", "sidecar_path_for", "read_sidecar", "load_sidecar"]

SIDECAR_SUFFIX = "_hierarchy.json"


def sidecar_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``dir/model.onnx`` -> ``dir/model_hierarchy.json``."""
    path = Path(model_path)
    return path.with_name(f"{path.stem}{SIDECAR_SUFFIX}")


def load_sidecar(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a sidecar file; OnnxFileError when missing, MetadataError when it is not a sidecar."""
    path = Path(path)
    if not path.is_file():
        raise OnnxFileError(
            f"hierarchy file not found: {path}", hint="pass the model_hierarchy.json written by export"
        )
    data = read_json_object(path, MetadataError, "re-export, or delete the broken sidecar")
    if not isinstance(data.get("nodes"), dict) or "tags" not in data:
        raise MetadataError(
            f"{path} is not a modelexport hierarchy file (no 'nodes'/'tags')",
            hint="re-export, or delete the broken sidecar",
        )
    return data


def read_sidecar(model_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar beside ``model_path``; None when there is none, MetadataError for a link out of its folder
    (a transform would carry what it points to)."""
    path = sidecar_path_for(model_path)
    path = safe_join(path.parent, path.name)
    return load_sidecar(path) if path.is_file() else None
