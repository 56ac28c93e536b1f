"""Write an ONNX model atomically: a crash or a failed step never leaves a file that looks complete."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .._io import atomic_path, onnx_weight_bytes

if TYPE_CHECKING:
    import onnx

__all__ = ["save_onnx", "EXTERNAL_DATA_THRESHOLD"]

#: Above this many weight bytes the model is saved with external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``path`` via a temp file and a rename (external data above the threshold)."""
    import onnx

    path = Path(path)
    large = onnx_weight_bytes(model) > EXTERNAL_DATA_THRESHOLD
    with atomic_path(path) as tmp:
        onnx.save_model(
            model, str(tmp), save_as_external_data=large, location=f"{path.name}.data" if large else None
        )
    return path
