"""What the model's graph expects: input names, dims (fixed or symbolic) and dtypes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..metadata.schema import KEY_INPUTS, KEY_OUTPUTS
from ..onnxfile import load_onnx
from ..runtime.types import ORT_TO_NUMPY as _ORT_TYPES

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, NodeArg

__all__ = ["GraphInput", "graph_inputs", "graph_outputs", "fixed_dim"]


@dataclass(frozen=True)
class GraphInput:
    """One graph input (or output): dims are ints when fixed, None when dynamic."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str = "float32"

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def dim(self, axis: int) -> int | None:
        return self.shape[axis] if -len(self.shape) <= axis < len(self.shape) else None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def fixed_dim(value: object) -> int | None:
    """A dim of ONNX Runtime or the metadata as an int when fixed; None when symbolic, unknown or not a size."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _from_meta(entries: list[dict[str, Any]]) -> list[GraphInput]:
    return [
        GraphInput(e["name"], tuple(fixed_dim(d) for d in e.get("shape") or []), e.get("dtype") or "float32")
        for e in entries
    ]


def _from_session(items: list[NodeArg]) -> list[GraphInput]:
    return [
        GraphInput(i.name, tuple(fixed_dim(d) for d in i.shape or []), _ORT_TYPES.get(i.type, "float32"))
        for i in items
    ]


def _from_onnx(path: Path, outputs: bool) -> list[GraphInput]:
    import onnx

    model = load_onnx(path, weights=False)
    init = {t.name for t in model.graph.initializer}
    items = model.graph.output if outputs else [v for v in model.graph.input if v.name not in init]
    result = []
    for v in items:
        t = v.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim
        )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "float32"
        result.append(GraphInput(v.name, dims, dtype))
    return result


def graph_inputs(
    source: InferenceSession | str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> list[GraphInput]:
    """Inputs from a session, the metadata (no graph parse) or the ONNX file."""
    if hasattr(source, "get_inputs"):
        return _from_session(source.get_inputs())
    if metadata and metadata.get(KEY_INPUTS):
        return _from_meta(metadata[KEY_INPUTS])
    return _from_onnx(Path(os.fspath(source)), outputs=False)


def graph_outputs(
    source: InferenceSession | str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> list[GraphInput]:
    if hasattr(source, "get_outputs"):
        return _from_session(source.get_outputs())
    if metadata and metadata.get(KEY_OUTPUTS):
        return _from_meta(metadata[KEY_OUTPUTS])
    return _from_onnx(Path(os.fspath(source)), outputs=True)
