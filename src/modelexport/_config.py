"""Helpers shared by the frozen dataclass configs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["split_names"]


def split_names(value: str | Iterable[Any] | None) -> tuple[str, ...]:
    """``"a, b"`` or ``["a", "b"]`` or ``None`` -> ``("a", "b")``: how every option takes a list of names."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(s for s in (str(v).strip() for v in items) if s)
