"""Atomic file writes: bad input must never leave a half-written file behind (several files at once: the one
output rule's staging, ``modelexport.onnxfile.output``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ModelExportError, OutputWriteError

if TYPE_CHECKING:
    import onnx

__all__ = [
    "atomic_path",
    "onnx_weight_bytes",
    "read_json_object",
    "parse_json",
    "write_json",
    "write_text",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
]

#: JSON files we read (manifests, sidecars, specs) are refused above this size before parsing.
MAX_JSON_BYTES = 256 * 1024 * 1024
#: Deeper JSON is refused before parsing: no file we read nests past a dozen levels, and deeper
#: values would overflow the recursion of every reader after the parser (copy, compare, print).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Read once at import: os.umask can only be read by setting it, which is not thread-safe mid-run.
_UMASK = _read_umask()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``target``; rename it over ``target`` only if the block succeeds."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputWriteError(f"cannot write to {target.parent}: {exc.strerror or exc}") from exc
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp makes 0600 files; give the output the usual umask-based mode
            os.chmod(tmp_path, 0o666 & ~_UMASK)
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _too_deep(text: str) -> bool:
    """Nesting past MAX_JSON_DEPTH, found at C speed: drop the strings and all but the brackets, then
    remove the innermost pairs once per level."""
    skeleton = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(MAX_JSON_DEPTH):
        skeleton, removed = _INNERMOST.subn("", skeleton)
        if not skeleton or not removed:  # flat enough, or unbalanced (the parser reports that)
            return False
    return bool(_INNERMOST.search(skeleton))


def parse_json(text: str, what: str, error: type[ModelExportError], hint: str | None = None) -> Any:
    """``text`` parsed as JSON, refusing oversized or deeply nested input before parsing.

    The one JSON parser for data read from files (manifests, sidecars, specs, embedded metadata);
    ``what`` names the source in the one-line ``error``.
    """
    if len(text) > MAX_JSON_BYTES:
        raise error(f"{what} is {len(text):,} characters; JSON over {MAX_JSON_BYTES:,} is refused", hint=hint)
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(text):
        raise error(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; refused", hint=hint)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
        raise error(f"{what} is not valid JSON ({reason})", hint=hint) from exc


def read_json_object(path: Path, error: type[ModelExportError], hint: str) -> dict[str, Any]:
    """The JSON object in ``path``; ``error`` (naming the file) when it is too large, not JSON or not an object."""
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise error(
                f"{path} is {size:,} bytes; JSON files over {MAX_JSON_BYTES:,} bytes are refused", hint=hint
            )
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON ({exc})", hint=hint) from exc
    data = parse_json(text, str(path), error, hint)
    if not isinstance(data, dict):
        raise error(f"{path} is not a JSON object", hint=hint)
    return data


def write_json(path: str | os.PathLike[str], data: object) -> Path:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write text, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def onnx_weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of a ModelProto's initializers, from their shapes.

    Decides whether a model needs external data (protobuf's 2 GB limit). ``ByteSize()`` or reading
    ``raw_data`` walks or copies the whole message (seconds for a fresh 400 MB model); shapes are free.
    """
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    total = 0
    for t in model.graph.initializer:
        try:
            itemsize = tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, TypeError):  # string tensors: count 8 bytes a value
            itemsize = 8
        total += int(np.prod(t.dims, dtype=np.int64)) * itemsize
    return total
