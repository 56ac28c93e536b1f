"""Reading a predictions file back, and comparing two runs row by row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def read_predictions(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def assert_same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]], tol: float = 1e-6) -> None:
    """Same ids (each once), same labels and errors, scores within ``tol``."""
    assert [r["id"] for r in got] == [r["id"] for r in want] == list(range(len(want)))
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, abs=tol), (a["id"], key)
            elif key == "prediction":
                assert [p["label"] for p in a[key]] == [p["label"] for p in value]
                assert [p["score"] for p in a[key]] == pytest.approx([p["score"] for p in value], abs=tol)
            else:
                assert a[key] == value, (a["id"], key)
