"""Shared helpers for the ratio benchmarks: timing, medians, JSON output."""

from __future__ import annotations

import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def require_optimum() -> None:
    """Exit with the way out when Optimum, the peer these benchmarks measure, is not installed: optimum-onnx
    needs transformers 4.57, so it lives in the second environment (``make venv-compat``)."""
    if importlib.util.find_spec("optimum") is None or importlib.util.find_spec("optimum.onnxruntime") is None:
        sys.exit(
            "this benchmark measures Optimum, which needs transformers 4.57: run it with .venv-compat/bin/python"
            " (make venv-compat builds that environment)"
        )


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of ``fn()`` over ``repeats`` runs."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "machine": {"python": platform.python_version(), "cpu": platform.processor()},
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
