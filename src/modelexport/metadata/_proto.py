"""Read and rewrite a ModelProto's ``metadata_props`` at the protobuf wire level, without the weights.

``metadata_props`` (field 14) is a top-level field of ModelProto; every other top-level field (the
graph with its initializers included) is skipped with one seek, so reading the metadata of a large
model costs a few small reads. Protobuf merges repeated fields wherever they appear, so a rewrite copies
the other fields as they are and appends the new entries.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import BinaryIO

from ..errors import OnnxFileError

__all__ = ["read_props", "rewrite_props", "encode_props"]

_METADATA_FIELD = 14
_MAX_FIELD = 1 << 29
_COPY_CHUNK = 1 << 22


def _varint(stream: BinaryIO, path: Path) -> int | None:
    """The next varint, or None at a clean end of file."""
    result, shift = 0, 0
    while True:
        byte = stream.read(1)
        if not byte:
            if shift == 0:
                return None
            raise OnnxFileError(f"{path} is truncated (ends inside a protobuf field header)")
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise OnnxFileError(f"{path} is not an ONNX file (malformed protobuf varint)")


def _buf_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise OnnxFileError("a metadata entry is truncated")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _parse_entry(buf: bytes) -> tuple[str, str]:
    """StringStringEntryProto: key = 1, value = 2."""
    pos, key, value = 0, "", ""
    while pos < len(buf):
        tag, pos = _buf_varint(buf, pos)
        if tag & 7 != 2:
            raise OnnxFileError("a metadata entry has an unexpected wire type")
        length, pos = _buf_varint(buf, pos)
        text = buf[pos : pos + length].decode("utf-8", errors="replace")
        pos += length
        if tag >> 3 == 1:
            key = text
        elif tag >> 3 == 2:
            value = text
    return key, value


def _walk(stream: BinaryIO, path: Path, size: int):
    """Yield (field, wire type, start offset, payload start, payload length or None) for each top-level field."""
    while True:
        start = stream.tell()
        tag = _varint(stream, path)
        if tag is None:
            return
        field, wire = tag >> 3, tag & 7
        if not 0 < field < _MAX_FIELD:
            raise OnnxFileError(f"{path} is not an ONNX file (bad protobuf field number {field})")
        if wire == 0:
            _varint(stream, path)
            yield field, wire, start, stream.tell(), 0
            continue
        if wire == 2:
            length = _varint(stream, path)
            if length is None:
                raise OnnxFileError(f"{path} is truncated")
        elif wire in (1, 5):
            length = 8 if wire == 1 else 4
        else:
            raise OnnxFileError(f"{path} is not an ONNX file (unsupported protobuf wire type {wire})")
        payload = stream.tell()
        if payload + length > size:
            raise OnnxFileError(
                f"{path} is truncated: a field runs {payload + length - size} bytes past the end of the file"
            )
        yield field, wire, start, payload, length
        stream.seek(payload + length)


def read_props(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The ``metadata_props`` entries of an ONNX file, in file order, reading only their bytes."""
    path = Path(path)
    size = path.stat().st_size
    entries: list[tuple[str, str]] = []
    saw_graph = False
    with path.open("rb") as f:
        for field, wire, _, payload, length in _walk(f, path, size):
            saw_graph |= field == 7
            if field == _METADATA_FIELD and wire == 2:
                f.seek(payload)
                entries.append(_parse_entry(f.read(length)))
    if not saw_graph:
        raise OnnxFileError(f"{path} is not an ONNX model (no graph)")
    return entries


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def encode_props(entries: dict[str, str]) -> bytes:
    """Serialized ``metadata_props`` fields for ``entries``."""
    out = bytearray()
    for key, value in entries.items():
        entry = _len_field(1, key.encode("utf-8")) + _len_field(2, value.encode("utf-8"))
        out += _len_field(_METADATA_FIELD, entry)
    return bytes(out)


def rewrite_props(src: str | os.PathLike[str], dst: str | os.PathLike[str], entries: dict[str, str]) -> None:
    """Copy ``src`` to ``dst`` with its ``metadata_props`` replaced by ``entries`` (other fields byte for byte)."""
    src = Path(src)
    size = src.stat().st_size
    with src.open("rb") as fin, open(dst, "wb") as fout:
        spans = [
            (start, payload + length)
            for field, _, start, payload, length in _walk(fin, src, size)
            if field != _METADATA_FIELD
        ]
        for start, end in spans:
            fin.seek(start)
            remaining = end - start
            while remaining:
                chunk = fin.read(min(remaining, _COPY_CHUNK))
                fout.write(chunk)
                remaining -= len(chunk)
        fout.write(encode_props(entries))
    shutil.copymode(src, dst)
