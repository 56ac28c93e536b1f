"""Shared helpers for the ratio benchmarks: timing, medians, JSON output."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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
