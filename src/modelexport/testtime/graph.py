"""Small ONNX graph passes used by test-time compute. Each returns a new model; inputs are never modified.

Loading accepts an exported folder (``model.onnx`` inside), a ``.onnx`` path, bytes or a ModelProto.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..onnxfile import load_onnx

__all__ = [
    "load_model",
    "expose_initializers",
    "add_outputs",
    "write_initializers",
    "initializer_arrays",
    "constant_value",
]


def load_model(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """A private copy of the model (callers may rewrite it freely); paths load through :func:`load_onnx`."""
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return load_onnx(model)


def initializer_arrays(model: onnx.ModelProto, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Initializers as numpy arrays (all, or the named ones)."""
    wanted = set(names) if names is not None else None
    return {
        t.name: numpy_helper.to_array(t)
        for t in model.graph.initializer
        if wanted is None or t.name in wanted
    }


def expose_initializers(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Make initializers overridable graph inputs (their stored value stays the default).

    ONNX Runtime then takes per-run values for them, so one shared session serves any adapted state
    without being modified, and it cannot constant-fold them away.
    """
    out = load_model(model)
    present = {i.name for i in out.graph.input}
    for t in out.graph.initializer:
        if t.name in names and t.name not in present:
            out.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _elem_type(model: onnx.ModelProto, name: str) -> int:
    for vi in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    return onnx.TensorProto.FLOAT


def add_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Expose intermediate tensors as extra graph outputs."""
    out = load_model(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - types then default to float
        inferred = out
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(helper.make_tensor_value_info(name, _elem_type(inferred, name), None))
    return out


def write_initializers(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with the named initializers replaced (same dtype and shape)."""
    out = load_model(model)
    for i, t in enumerate(out.graph.initializer):
        if t.name in values:
            old = numpy_helper.to_array(t)
            new = np.asarray(values[t.name], dtype=old.dtype).reshape(old.shape)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(new, t.name))
    return out


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of a tensor produced by a Constant node or stored as an initializer (None otherwise)."""
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    return np.asarray(helper.get_attribute_value(attr))
    return None
