"""Read, update and write the embedded metadata: verified on read, cached per file, edited atomically."""

from __future__ import annotations

import copy
import os
import threading
from typing import TYPE_CHECKING, Any

from .._io import atomic_path
from ..errors import MetadataError
from ..onnxfile import resolve_model_path
from ._proto import read_props, rewrite_props
from .schema import KEY_CHECKSUM, KEY_ENCODING, KEY_VERSION, METADATA_VERSION, decode_entries, encode_entries

if TYPE_CHECKING:
    import onnx

__all__ = ["read_metadata", "update_metadata", "write_metadata", "clear_cache"]

_CACHE: dict[str, tuple[int, int, dict[str, Any]]] = {}
_LOCK = threading.Lock()


def _stored_of_proto(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _combined(values: dict[str, Any], foreign: dict[str, str]) -> dict[str, Any]:
    return {**foreign, **values}


def read_metadata(model: str | os.PathLike[str] | onnx.ModelProto) -> dict[str, Any]:
    """Decoded metadata (JSON values parsed, checksum verified) of a file, a folder or a ModelProto.

    Files are read without their weights and cached by (path, size, mtime). A model with no
    metadata gives ``{}``; a tampered one raises :class:`~modelexport.errors.MetadataIntegrityError`.
    """
    if hasattr(model, "metadata_props"):
        values, foreign = decode_entries(_stored_of_proto(model))
        return _combined(values, foreign)
    path = resolve_model_path(model)
    stat = path.stat()
    key = str(path.resolve())
    with _LOCK:
        hit = _CACHE.get(key)
    if hit and hit[0] == stat.st_size and hit[1] == stat.st_mtime_ns:
        return copy.deepcopy(hit[2])
    entries = dict(read_props(path))
    values, foreign = decode_entries(entries)
    result = _combined(values, foreign)
    with _LOCK:
        _CACHE[key] = (stat.st_size, stat.st_mtime_ns, result)
    return copy.deepcopy(result)


def clear_cache() -> None:
    """Forget every cached read (tests, or after editing files by other means)."""
    with _LOCK:
        _CACHE.clear()


def _merged(stored: dict[str, str], updates: dict[str, Any], verify: bool) -> dict[str, str]:
    reserved = sorted({KEY_ENCODING, KEY_CHECKSUM} & set(updates))
    if reserved:
        raise MetadataError(
            f"{', '.join(reserved)} is written by modelexport itself from the other values; it cannot be set",
            hint="set the values you mean to change; use --force to re-sign metadata edited by hand",
        )
    values, foreign = decode_entries(stored, verify=verify)
    for key, value in updates.items():
        foreign.pop(key, None)
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    values.setdefault(KEY_VERSION, METADATA_VERSION)
    return encode_entries(values, foreign)


def update_metadata(model_proto: onnx.ModelProto, updates: dict[str, Any], *, verify: bool = True) -> None:
    """Merge ``updates`` into a ModelProto's metadata in place (``None`` deletes a key); re-encode and re-checksum.

    ``verify=False`` accepts metadata that fails its checksum (repairing a hand-edited file).
    """
    entries = _merged(_stored_of_proto(model_proto), updates, verify)
    del model_proto.metadata_props[:]
    for key, value in entries.items():
        prop = model_proto.metadata_props.add()
        prop.key, prop.value = key, value


def write_metadata(
    path: str | os.PathLike[str], updates: dict[str, Any], *, verify: bool = True
) -> dict[str, Any]:
    """Apply ``updates`` to an ONNX file atomically, without loading its weights; returns the new metadata."""
    file = resolve_model_path(path)
    entries = _merged(dict(read_props(file)), updates, verify)
    with atomic_path(file) as tmp:
        rewrite_props(file, tmp, entries)
    return read_metadata(file)
