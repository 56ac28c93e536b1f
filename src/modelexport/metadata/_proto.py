"""Read and rewrite a ModelProto's ``metadata_props`` at the protobuf wire level, without the weights.

``metadata_props`` (field 14) is a top-level field of ModelProto; every other top-level field (the
graph with its initializers included) is skipped by the shared wire walker over a memory map, so
reading the metadata of a large model touches a few pages. Protobuf merges repeated fields wherever
they appear, so a rewrite copies the other fields as they are and appends the new entries.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

from ..errors import OnnxFileError
from ..onnxfile._wire import iter_fields, len_field

__all__ = ["read_props", "rewrite_props", "encode_props"]

_MODEL_GRAPH = 7
_METADATA_FIELD = 14
_COPY_CHUNK = 1 << 22


def _parse_entry(buf: bytes) -> tuple[str, str]:
    """StringStringEntryProto: key = 1, value = 2."""
    key = value = ""
    for f in iter_fields(buf):
        if f.wire != 2:
            raise ValueError("a metadata entry has an unexpected wire type")
        text = bytes(buf[f.payload : f.end]).decode("utf-8", errors="replace")
        if f.number == 1:
            key = text
        elif f.number == 2:
            value = text
    return key, value


def _top_fields(path: Path, buf: mmap.mmap) -> list:
    try:
        fields = list(iter_fields(buf))
    except ValueError as exc:
        raise OnnxFileError(f"{path} is not an ONNX model or is truncated ({exc})") from exc
    if not any(f.number == _MODEL_GRAPH for f in fields):
        raise OnnxFileError(f"{path} is not an ONNX model (no graph)")
    return fields


def _mapped(path: Path):
    if path.stat().st_size == 0:
        raise OnnxFileError(f"{path} is empty (0 bytes)")
    fh = path.open("rb")
    return fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def read_props(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The ``metadata_props`` entries of an ONNX file, in file order, reading only their bytes."""
    path = Path(path)
    fh, buf = _mapped(path)
    with fh, buf:
        entries = []
        for f in _top_fields(path, buf):
            if f.number == _METADATA_FIELD and f.wire == 2:
                try:
                    entries.append(_parse_entry(buf[f.payload : f.end]))
                except ValueError as exc:
                    raise OnnxFileError(f"{path}: a metadata entry is malformed ({exc})") from exc
        return entries


def encode_props(entries: dict[str, str]) -> bytes:
    """Serialized ``metadata_props`` fields for ``entries``."""
    out = bytearray()
    for key, value in entries.items():
        entry = len_field(1, key.encode("utf-8")) + len_field(2, value.encode("utf-8"))
        out += len_field(_METADATA_FIELD, entry)
    return bytes(out)


def rewrite_props(src: str | os.PathLike[str], dst: str | os.PathLike[str], entries: dict[str, str]) -> None:
    """Copy ``src`` to ``dst`` with its ``metadata_props`` replaced by ``entries`` (other fields byte for byte)."""
    src = Path(src)
    fh, buf = _mapped(src)
    with fh, buf, open(dst, "wb") as out:
        for f in _top_fields(src, buf):
            if f.number == _METADATA_FIELD:
                continue
            for pos in range(f.start, f.end, _COPY_CHUNK):
                out.write(buf[pos : min(pos + _COPY_CHUNK, f.end)])
        out.write(encode_props(entries))
    shutil.copymode(src, dst)
