"""A model opened for inspection: the ONNX graph, where it came from, and its sidecar when there is one.

Resolving the path, parsing with typed errors and reading the sidecar are the shared implementations
in :mod:`modelexport.onnxfile`; this module only bundles their results with the graph index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import onnx

from ..hierarchy.graph import GraphIndex
from ..onnxfile import load_onnx, load_sidecar, read_sidecar, resolve_model_path, sidecar_path_for

__all__ = ["ModelLike", "SidecarLike", "TaggedModel", "load_tagged_model"]

PathLike = str | os.PathLike[str]
#: What :func:`load_tagged_model` opens: a path (an ``.onnx`` file or an export folder) or a ``ModelProto``.
ModelLike = PathLike | onnx.ModelProto
#: Which sidecar goes with it: a path or the sidecar itself; ``None`` the one beside the model, ``False`` none.
SidecarLike = PathLike | dict[str, Any] | bool | None


@dataclass
class TaggedModel:
    """A loaded model, where it came from, and its sidecar when there is one."""

    proto: onnx.ModelProto
    path: Path | None = None
    sidecar: dict[str, Any] | None = None
    sidecar_path: Path | None = None
    #: False when loaded for statistics only: initializers carry names, dims and dtypes but no values.
    has_weights: bool = True
    #: Set when weights stored as external data stay on disk (``external_data=False``): the folder their
    #: references resolve in. Sessions read them from there; saving copies them (``save_onnx(data_dir=)``).
    data_dir: Path | None = None

    @cached_property
    def index(self) -> GraphIndex:
        return GraphIndex.build(self.proto)

    @property
    def name(self) -> str:
        return str(self.path) if self.path else "<model>"

    @property
    def opset(self) -> int:
        return next((o.version for o in self.proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _sidecar(path: Path, hierarchy: SidecarLike) -> tuple[dict[str, Any] | None, Path | None]:
    if hierarchy is False:
        return None, None
    if isinstance(hierarchy, dict):
        return hierarchy, None
    if hierarchy is None:  # the one beside the model, read from inside its folder (read_sidecar)
        sidecar = read_sidecar(path)
        return sidecar, sidecar_path_for(path) if sidecar is not None else None
    side = Path(hierarchy) if hierarchy else sidecar_path_for(path)
    return load_sidecar(side), side


def load_tagged_model(
    model: ModelLike,
    *,
    hierarchy: SidecarLike = None,
    weights: bool = True,
    external_data: bool = True,
) -> TaggedModel:
    """Load a model (path, export folder or ``ModelProto``) and its sidecar.

    ``hierarchy``: a sidecar dict or path; ``None`` looks beside the model; ``False`` ignores it.
    ``weights=False`` reads the structure only (the fast path for statistics on large models).
    ``external_data=False`` loads the weights stored inside the file but leaves those stored as external
    data on disk (``data_dir`` says where): a model over protobuf's 2 GB limit is then never one protobuf.
    """
    if isinstance(model, onnx.ModelProto):
        sidecar = hierarchy if isinstance(hierarchy, dict) else None
        if isinstance(hierarchy, (str, os.PathLike)):
            sidecar = load_sidecar(hierarchy)
        return TaggedModel(model, None, sidecar, None)
    path = resolve_model_path(model)
    proto = load_onnx(path, weights=weights, external_data=external_data)
    sidecar, side = _sidecar(path, hierarchy)
    data_dir = path.parent if weights and not external_data else None
    return TaggedModel(proto, path, sidecar, side, has_weights=weights, data_dir=data_dir)
