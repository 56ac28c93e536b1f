"""Inputs for running a model under inspection: generated from its input signature, or read from ``.npz``.

Generated inputs follow the export's input specs when the sidecar has them (shape and value range
of each input), else the graph's declared shapes with dynamic dimensions set to small sizes and
integer inputs drawn from a safe range, so that ids stay inside any vocabulary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.readers import read_npz
from ..errors import InferenceError, InputSpecError, first_line
from ..hierarchy.graph import index_limits
from ..runtime.types import ORT_TO_NUMPY as _ORT_TYPES

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

__all__ = [
    "generate_inputs",
    "load_npz_inputs",
    "run_session",
    "DYNAMIC_BATCH",
    "DYNAMIC_DIM",
    "INT_RANGE",
]

DYNAMIC_BATCH = 1
DYNAMIC_DIM = 16
INT_RANGE = (0, 100)


def _specs(sidecar: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    specs = ((sidecar or {}).get("export") or {}).get("input_specs") or []
    return {s["name"]: s for s in specs if isinstance(s, dict) and "name" in s}


def _shape(declared: list[Any], spec: dict[str, Any] | None) -> list[int]:
    if spec and len(spec.get("shape", [])) == len(declared):
        return [int(d) for d in spec["shape"]]
    return [
        d if isinstance(d, int) and d > 0 else (DYNAMIC_BATCH if k == 0 else DYNAMIC_DIM)
        for k, d in enumerate(declared)
    ]


def _values(
    rng: np.random.Generator, shape: list[int], dtype: str, spec: dict[str, Any] | None
) -> np.ndarray:
    import numpy as np

    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(np.dtype(dtype), np.integer):
        lo, hi = (spec or {}).get("range") or INT_RANGE
        return rng.integers(int(lo), max(int(hi), int(lo) + 1), size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def generate_inputs(
    session: ort.InferenceSession,
    sidecar: dict[str, Any] | None = None,
    seed: int = 0,
    model: onnx.ModelProto | None = None,
) -> dict[str, np.ndarray]:
    """One input per session input, shaped by the sidecar's specs or the declared shape.

    Without a spec, integer inputs that index a table (``Gather``) of ``model`` stay below its row count.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    specs = _specs(sidecar)
    limits = index_limits(model) if model is not None else {}
    out = {}
    for arg in session.get_inputs():
        dtype = _ORT_TYPES.get(arg.type)
        if dtype is None:
            raise InputSpecError(
                f"cannot generate input {arg.name!r} of type {arg.type}", hint="pass --inputs FILE.npz"
            )
        spec = specs.get(arg.name)
        if spec is None and arg.name in limits:
            spec = {"range": [0, min(limits[arg.name], INT_RANGE[1])]}
        out[arg.name] = _values(rng, _shape(list(arg.shape), spec), dtype, spec)
    return out


def run_session(
    session: ort.InferenceSession, feed: dict[str, np.ndarray], outputs: list[str] | None = None
) -> list[Any]:
    """``session.run`` with ONNX Runtime's failures turned into one-line InferenceErrors."""
    try:
        return session.run(outputs, feed)
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types for bad inputs
        first = first_line(exc)
        raise InferenceError(
            f"ONNX Runtime failed to run the model: {first}",
            hint="pass matching inputs with --inputs FILE.npz",
        ) from exc


def load_npz_inputs(
    path: str | os.PathLike[str], session: ort.InferenceSession | None = None
) -> dict[str, np.ndarray]:
    """Arrays from an ``.npz`` keyed by input name; checks that every session input is there."""
    path = Path(path)
    if not path.is_file():
        raise InputSpecError(
            f"inputs file not found: {path}", hint="pass an .npz made with numpy.savez(path, name=array, ...)"
        )
    arrays = read_npz(path, InputSpecError)
    if session is not None:
        wanted = [a.name for a in session.get_inputs()]
        missing = [n for n in wanted if n not in arrays]
        if missing:
            raise InputSpecError(
                f"{path} lacks inputs {missing}; the model takes {wanted}, the file has {sorted(arrays)}"
            )
        arrays = {n: arrays[n] for n in wanted}
    return arrays
