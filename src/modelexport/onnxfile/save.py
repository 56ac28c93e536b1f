"""Write an ONNX model atomically: a crash or a failed step never leaves a file that looks complete.

Large models (weights above :data:`EXTERNAL_DATA_THRESHOLD`, or weights already kept on disk as external
data) are written as a small structure file plus ``<name>.data``, one tensor at a time: the weights are
never serialized into one protobuf (protobuf's limit is 2 GB), and the caller's model is never modified.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

from .._io import atomic_path, onnx_weight_bytes
from ..errors import OnnxFileError
from .load import load_structure

if TYPE_CHECKING:
    import onnx

__all__ = [
    "save_onnx",
    "external_tensors",
    "load_external_tensors",
    "needs_external_data",
    "model_bytes",
    "EXTERNAL_DATA_THRESHOLD",
    "WRITE_BYTES",
    "write_in_pieces",
]

#: Above this many weight bytes the model is saved with external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
#: Tensors smaller than this stay inside the structure file (onnx's own default threshold).
_INLINE_BYTES = 1024
_CHUNK = 64 << 20
#: Bytes per ``write`` call of external data. A filesystem with large folios (ext4 and XFS on Linux 6.x) caches
#: a file in folios as large as the writes that made it, up to 2 MB, and a process that maps the file gets the
#: whole folio mapped when it touches one byte of it: a session gathering 128 rows of an embedding table
#: written in one piece then holds ~100 MB more resident memory than one written in 64 KiB pieces (ONNX
#: Runtime maps its external data; 64 KiB is also the kernel's fault-around window).
WRITE_BYTES = 64 << 10
#: The messages whose big field :func:`_without` leaves out.
_Proto = TypeVar("_Proto", "onnx.GraphProto", "onnx.ModelProto")


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers whose data is a reference to a file (``load_onnx(..., external_data=False)``)."""
    import onnx

    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def needs_external_data(model: onnx.ModelProto) -> bool:
    """True when ``model`` must be written with external data: weights over the threshold, or some already
    kept on disk as references."""
    return bool(external_tensors(model)) or onnx_weight_bytes(model) > EXTERNAL_DATA_THRESHOLD


def load_external_tensors(model: onnx.ModelProto, data_dir: str | os.PathLike[str]) -> None:
    """Read the data of ``model``'s external-data references (resolved in ``data_dir``) into the model.

    For a model built from a few tensors of a large one (a module cut out, float weights restored):
    only those tensors are read, each once.
    """
    from onnx.external_data_helper import load_external_data_for_tensor

    for tensor in external_tensors(model):
        load_external_data_for_tensor(tensor, str(data_dir))
        tensor.ClearField("data_location")
        del tensor.external_data[:]


def model_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of an ONNX file plus the external data files it references (what the model weighs on disk)."""
    path = Path(path)
    locations = {_info(t)[0] for t in external_tensors(load_structure(path))}
    return path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations)


def _info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    entries = {e.key: e.value for e in tensor.external_data}
    length = entries.get("length")
    return entries.get("location", ""), int(entries.get("offset") or 0), int(length) if length else None


def write_in_pieces(out: IO[bytes], data: bytes | memoryview) -> None:
    """Write ``data`` in :data:`WRITE_BYTES` pieces (the page cache then holds no folio a reader maps whole)."""
    view = memoryview(data)
    for start in range(0, len(view), WRITE_BYTES):
        out.write(view[start : start + WRITE_BYTES])


def _copy_range(src: Path, offset: int, length: int | None, out: IO[bytes]) -> None:
    with open(src, "rb") as fh:
        fh.seek(offset)
        while length is None or length > 0:
            chunk = fh.read(_CHUNK if length is None else min(_CHUNK, length))
            if not chunk:
                if length is None:
                    return
                raise OnnxFileError(f"external data file {src} ends before the tensor data it should hold")
            write_in_pieces(out, chunk)
            if length is not None:
                length -= len(chunk)


def _reference(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> onnx.TensorProto:
    """``tensor``'s name, type and shape, its data at ``location[offset:offset+length]``."""
    import onnx

    ref = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type)
    ref.dims.extend(tensor.dims)
    if tensor.HasField("doc_string"):
        ref.doc_string = tensor.doc_string
    ref.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        ref.external_data.add(key=key, value=value)
    return ref


def _without(message: _Proto, skip: str) -> _Proto:
    """A copy of ``message`` without its field ``skip`` (the big field is never copied)."""
    out = type(message)()
    for f, value in message.ListFields():
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED
        if f.name == skip:
            continue
        if repeated:
            getattr(out, f.name).extend(value)
        elif f.type == f.TYPE_MESSAGE:
            getattr(out, f.name).CopyFrom(value)
        else:
            setattr(out, f.name, value)
    return out


def _write_external(
    model: onnx.ModelProto, data_path: Path, data_name: str, data_dir: Path | None
) -> onnx.ModelProto:
    """Write every large tensor to ``data_path``, one at a time; returns the structure that references
    them under ``data_name`` (the data file's final name)."""
    import onnx

    graph = _without(model.graph, "initializer")
    with open(data_path, "wb") as out:
        for tensor in model.graph.initializer:
            offset = out.tell()
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                if data_dir is None:
                    raise ValueError(
                        f"{tensor.name!r} is external data: pass data_dir, the folder it lives in"
                    )
                location, start, length = _info(tensor)
                _copy_range(data_dir / location, start, length, out)
            elif tensor.HasField("raw_data") and (raw := tensor.raw_data) and len(raw) >= _INLINE_BYTES:
                write_in_pieces(out, raw)
                del raw
            else:
                graph.initializer.add().CopyFrom(tensor)
                continue
            graph.initializer.append(_reference(tensor, data_name, offset, out.tell() - offset))
    structure = _without(model, "graph")
    structure.graph.CopyFrom(graph)
    return structure


def save_onnx(
    model: onnx.ModelProto,
    path: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    external_data: bool | None = None,
) -> Path:
    """Write ``model`` to ``path`` via a temp file and a rename; ``model`` itself is left as it is.

    External data (``<name>.data`` beside it) when ``external_data`` is True, or (None) when the weights pass
    the threshold or ``model`` keeps some weights as references to files (``load_onnx(..., external_data=False)``):
    those are copied from ``data_dir``, the folder they resolve in, chunk by chunk, never loaded whole.
    ONNX Runtime maps an external data file instead of parsing the weights out of one protobuf: a session
    starts faster and holds one copy of them (weight-only quantized models are always written so).
    """
    import onnx

    path = Path(path)
    refs = external_tensors(model)
    data_path = path.parent / f"{path.name}.data"
    folder = Path(data_dir) if data_dir is not None else None
    if folder is not None and any((folder / _info(t)[0]).resolve() == data_path.resolve() for t in refs):
        raise OnnxFileError(
            f"{path} would overwrite the external data file its own weights are read from ({data_path.name})",
            hint="write the model to another path",
        )
    with atomic_path(path) as tmp:
        if not (external_data or needs_external_data(model)):
            onnx.save_model(model, str(tmp))
            return path
        # Both files are complete before either is renamed: the data first, then the structure.
        with atomic_path(data_path) as data_tmp:
            model = _write_external(model, data_tmp, data_path.name, folder)
            onnx.save_model(model, str(tmp))
    return path
