"""Check a parsed ModelProto's structure before any field is used: the values protobuf accepts but no model has.

Protobuf parses an ``int32`` field with any value and a proto2 ``string`` field with invalid UTF-8
(it comes back as ``bytes``); every reader after the loader would then fail in its own way (a
``KeyError`` on a data type, ``re`` on bytes). One walk here turns each of them into one
:class:`~modelexport.errors.OnnxFileError` naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OnnxFileError

if TYPE_CHECKING:
    import onnx
    from google.protobuf.message import Message

__all__ = ["check_structure"]

#: TensorProto fields read as values here; the payload fields (raw_data, float_data...) are never touched.
_TENSOR_TEXT = ("name", "doc_string")


class _Bad(Exception):
    """A structural problem, with the dotted field path where it is."""


def _data_types() -> frozenset[int]:
    import onnx

    return frozenset(onnx.TensorProto.DataType.values())


def _check_text(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise _Bad(f"{where} is not valid UTF-8 text")


def _check_tensor(tensor: onnx.TensorProto, where: str, dtypes: frozenset[int]) -> None:
    for name in _TENSOR_TEXT:
        _check_text(getattr(tensor, name), f"{where}.{name}")
    if tensor.data_type not in dtypes or tensor.data_type == 0:
        raise _Bad(f"{where} ({tensor.name!r}) has an unknown data type {tensor.data_type}")
    if any(d < 0 for d in tensor.dims):
        raise _Bad(f"{where} ({tensor.name!r}) has a negative dimension {list(tensor.dims)}")
    for entry in tensor.external_data:
        _check_text(entry.key, f"{where}.external_data")
        _check_text(entry.value, f"{where}.external_data")


def _check_type(type_proto: onnx.TypeProto, where: str, dtypes: frozenset[int]) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(type_proto, kind)
        if tensor.elem_type not in dtypes:
            raise _Bad(f"{where} has an unknown element type {tensor.elem_type}")
        for dim in tensor.shape.dim:
            if dim.WhichOneof("value") == "dim_value" and dim.dim_value < 0:
                raise _Bad(f"{where} has a negative dimension {dim.dim_value}")
    _walk(type_proto, where, dtypes)


def _walk(message: Message, where: str, dtypes: frozenset[int]) -> None:
    """Every string field is text, every tensor and type has a known data type, recursively."""
    from google.protobuf.descriptor import FieldDescriptor as F

    for field, value in message.ListFields():
        path = f"{where}.{field.name}"
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == F.LABEL_REPEATED
        items = value if repeated else (value,)
        if field.type == F.TYPE_STRING:
            for item in items:
                _check_text(item, path)
        elif field.type == F.TYPE_MESSAGE:
            checker = _CHECKERS.get(field.message_type.full_name, _walk)
            for i, item in enumerate(items):
                checker(item, f"{path}[{i}]" if repeated else path, dtypes)


_CHECKERS = {"onnx.TensorProto": _check_tensor, "onnx.TypeProto": _check_type}


def _check_io(graph: onnx.GraphProto) -> None:
    for kind in ("input", "output"):
        for value in getattr(graph, kind):
            if value.type.WhichOneof("value") == "tensor_type" and value.type.tensor_type.elem_type == 0:
                raise _Bad(f"graph {kind} {value.name!r} has no element type")


def check_structure(model: onnx.ModelProto, path: Path) -> None:
    """Raise OnnxFileError when ``model`` (parsed from ``path``) holds a value no valid model has."""
    try:
        _walk(model, "model", _data_types())
        _check_io(model.graph)
    except _Bad as exc:
        raise OnnxFileError(f"{path} is corrupted: {exc}") from None
    except RecursionError:
        raise OnnxFileError(f"{path} is corrupted: its sub-graphs are nested too deeply") from None
