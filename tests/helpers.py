"""Assertions and facts about the environment shared by test packages."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

__all__ = ["HAS_OPTIMUM", "assert_nested_close", "message_lines"]


def _has_optimum() -> bool:
    try:
        return importlib.util.find_spec("optimum") is not None and bool(
            importlib.util.find_spec("optimum.onnxruntime")
        )
    except (ImportError, ValueError):
        return False


#: Optimum installs only beside transformers 4.57: the tests marked ``optimum`` run in `make test-compat`.
HAS_OPTIMUM = _has_optimum()


def assert_nested_close(a: Any, b: Any, tol: float = 1e-4) -> None:
    """Pipeline outputs (dicts/lists of floats and labels) equal up to ``tol`` on every float."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_nested_close(a[k], b[k], tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_nested_close(x, y, tol)
    elif isinstance(a, (float, np.floating)):
        assert abs(float(a) - float(b)) <= tol
    else:
        assert a == b


def message_lines(text: str) -> list[str]:
    """The CLI's messages, one per item: an ``Error:``/``Hint:`` wrapped to the terminal (continuation lines
    indented by four spaces) is joined back into the one line it says."""
    lines: list[str] = []
    for line in text.strip().splitlines():
        if line.startswith("    ") and lines and not lines[-1].startswith(" "):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines
