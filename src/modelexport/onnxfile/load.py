"""Load an ONNX model with one clear error for each way a file can be unusable.

Two depths: ``weights=True`` parses everything (external data included, only from inside the model's
folder); ``weights=False`` reads the structure over a memory map and skips every tensor payload, so a
large model's weights are never read (names, dims and dtypes are kept: enough for statistics, not for
running). Missing, empty, non-ONNX and truncated files raise the same typed errors at both depths, and so do
values protobuf parses but no model has (unknown data types, invalid UTF-8 text: see :mod:`.check`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OnnxFileError
from ._wire import iter_fields, len_field
from .check import check_structure
from .resolve import resolve_model_path

if TYPE_CHECKING:
    import onnx

__all__ = ["load_onnx", "load_structure", "check_external_locations"]

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
#: TensorProto payload fields: float/int32/string/int64 data, raw_data, double/uint64 data.
_TENSOR_PAYLOAD = frozenset({4, 5, 6, 7, 9, 10, 11})


def _strip_tensor(buf: mmap.mmap, start: int, end: int) -> bytes:
    return b"".join(
        bytes(buf[f.start : f.end]) for f in iter_fields(buf, start, end) if f.number not in _TENSOR_PAYLOAD
    )


def _strip_graph(buf: mmap.mmap, start: int, end: int) -> bytes:
    parts = []
    for f in iter_fields(buf, start, end):
        if f.number == _GRAPH_INITIALIZER and f.wire == 2:
            parts.append(len_field(f.number, _strip_tensor(buf, f.payload, f.end)))
        else:
            parts.append(bytes(buf[f.start : f.end]))
    return b"".join(parts)


def load_structure(path: Path) -> onnx.ModelProto:
    """``path`` parsed without any initializer payload (ValueError/DecodeError on malformed bytes)."""
    import onnx

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        parts = []
        for f in iter_fields(buf, 0, len(buf)):
            if f.number == _MODEL_GRAPH and f.wire == 2:
                parts.append(len_field(f.number, _strip_graph(buf, f.payload, f.end)))
            else:
                parts.append(bytes(buf[f.start : f.end]))
    proto = onnx.ModelProto()
    proto.ParseFromString(b"".join(parts))
    return proto


def check_external_locations(model: onnx.ModelProto, folder: Path) -> None:
    """Refuse external-data locations that leave the model's folder (``../``, absolute, symlinks out)."""
    from onnx.external_data_helper import uses_external_data

    root = folder.resolve()
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or Path(location).is_absolute() or root not in (target, *target.parents):
            raise OnnxFileError(
                f"initializer {tensor.name!r} stores its data at {location!r}, outside the model's folder",
                hint="keep external data files beside the model; refusing to read files elsewhere",
            )


def _parse(path: Path, weights: bool, external_data: bool) -> onnx.ModelProto:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        proto = load_structure(path) if not weights else onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, IndexError, RuntimeError) as exc:
        raise OnnxFileError(f"{path} is not an ONNX model or is truncated/corrupted ({exc})") from exc
    except OSError as exc:
        raise OnnxFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    check_external_locations(proto, path.parent)
    if not weights or not external_data:
        return proto
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:
        raise OnnxFileError(
            f"cannot read the external data of {path}: {exc}",
            hint="keep the model's external data file(s) beside it, under the names recorded in the model",
        ) from exc
    return proto


def _check_complete(proto: onnx.ModelProto, path: Path) -> None:
    problems = []
    if not proto.ir_version:
        problems.append("no IR version")
    if not proto.HasField("graph") or not proto.graph.output:
        problems.append("no graph outputs")
    if not proto.opset_import:
        problems.append("no opset imports")
    if problems:
        raise OnnxFileError(f"{path} is not an ONNX model or is truncated ({', '.join(problems)})")
    check_structure(proto, path)


def load_onnx(
    model: str | os.PathLike[str], *, weights: bool = True, external_data: bool = True
) -> onnx.ModelProto:
    """The model at ``model`` (a file or a package folder, see :func:`resolve_model_path`).

    ``weights=False`` reads the structure only: initializers keep names, dims and dtypes, not values.
    ``external_data=False`` keeps external tensors as references (to re-save the model in its folder).
    """
    path = resolve_model_path(model)
    if path.stat().st_size == 0:
        raise OnnxFileError(f"{path} is empty (0 bytes)")
    proto = _parse(path, weights, external_data)
    _check_complete(proto, path)
    return proto
