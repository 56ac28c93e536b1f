"""Read an ONNX file's structure without its weight bytes.

Analysis needs each initializer's name, dims and dtype, never its values. Parsing a 440 MB model
with protobuf copies every byte (about a second and twice the file in memory); walking the protobuf
wire format over a memory map instead copies only the graph structure and skips the tensor payloads,
so the pages holding the weights are never even read. The result is a normal ``ModelProto`` whose
initializers have no data: fine for statistics, unusable for running or checking the model.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

__all__ = ["load_structure"]

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
#: TensorProto payload fields: float/int32/string/int64 data, raw_data, double/uint64 data.
_TENSOR_PAYLOAD = {4, 5, 6, 7, 9, 10, 11}


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: Any, start: int, end: int):
    """Yield (field number, field start, payload start, field end) of each field in ``buf[start:end]``."""
    pos = start
    while pos < end:
        begin = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        payload = pos
        if wire == 0:
            _, pos = _varint(buf, pos)
            payload = pos
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, payload = _varint(buf, pos)
            pos = payload + length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("truncated message")
        yield field, begin, payload, pos


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _submessage(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _strip_tensor(buf: Any, start: int, end: int) -> bytes:
    return b"".join(bytes(buf[b:e]) for f, b, _, e in _fields(buf, start, end) if f not in _TENSOR_PAYLOAD)


def _strip_graph(buf: Any, start: int, end: int) -> bytes:
    parts = []
    for field, begin, payload, stop in _fields(buf, start, end):
        if field == _GRAPH_INITIALIZER:
            parts.append(_submessage(field, _strip_tensor(buf, payload, stop)))
        else:
            parts.append(bytes(buf[begin:stop]))
    return b"".join(parts)


def load_structure(path: str | os.PathLike[str]) -> Any:
    """A ``ModelProto`` of ``path`` with every initializer's payload left out (names, dims, dtypes kept)."""
    import onnx

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        parts = []
        for field, begin, payload, stop in _fields(buf, 0, len(buf)):
            if field == _MODEL_GRAPH:
                parts.append(_submessage(field, _strip_graph(buf, payload, stop)))
            else:
                parts.append(bytes(buf[begin:stop]))
    proto = onnx.ModelProto()
    proto.ParseFromString(b"".join(parts))
    return proto
