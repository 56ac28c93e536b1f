"""The protobuf wire format, read in place: one varint reader and one field walker for every raw reader.

Structure-only loading (weights skipped) and the metadata reader/rewriter both walk a memory-mapped
file instead of parsing it, so the pages holding the weights are never read. Every malformed byte
sequence becomes a ``ValueError`` that the callers turn into a typed error naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Protocol

__all__ = ["Buffer", "WireField", "read_varint", "iter_fields", "encode_varint", "len_field"]

#: A varint never needs more than 10 bytes (64 bits, 7 per byte).
_MAX_VARINT_BYTES = 10
_MAX_FIELD = 1 << 29


class Buffer(Protocol):
    """Indexable bytes: ``bytes``, ``memoryview`` or ``mmap``."""

    def __getitem__(self, index: int) -> int: ...

    def __len__(self) -> int: ...


class WireField(NamedTuple):
    """One field of a message; its payload is ``buf[payload:end]``, the whole field ``buf[start:end]``."""

    number: int
    wire: int
    start: int
    payload: int
    end: int


def read_varint(buf: Buffer, pos: int, end: int | None = None) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; ValueError when it is truncated or too long."""
    end = len(buf) if end is None else end
    result = shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise ValueError("truncated (ends inside a varint)")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("malformed varint (longer than 10 bytes)")


def iter_fields(buf: Buffer, start: int = 0, end: int | None = None) -> Iterator[WireField]:
    """Each field of the message in ``buf[start:end]``; payloads are skipped, never copied."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        begin = pos
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if not 0 < number < _MAX_FIELD:
            raise ValueError(f"bad protobuf field number {number}")
        payload = pos
        if wire == 0:
            _, pos = read_varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, payload = read_varint(buf, pos, end)
            pos = payload + length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError(f"truncated (a field runs {pos - end} bytes past its end)")
        yield WireField(number, wire, begin, payload, pos)


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (sub-message, string or bytes)."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload
