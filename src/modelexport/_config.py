"""Helpers shared by the frozen dataclass configs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

from .errors import ConfigError, ModelExportError

__all__ = ["split_names", "unknown_choice", "closest", "replace_checked"]

_Config = TypeVar("_Config")


def split_names(value: str | Iterable[Any] | None) -> tuple[str, ...]:
    """``"a, b"`` or ``["a", "b"]`` or ``None`` -> ``("a", "b")``: how every option takes a list of names."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(s for s in (str(v).strip() for v in items) if s)


def closest(value: object, valid: Iterable[str], synonyms: Mapping[str, str] | None = None) -> str | None:
    """The valid name ``value`` was most likely meant to be (a typo, another case, a common synonym), or None."""
    names = list(valid)
    key = str(value).strip().lower()
    if synonyms and key in synonyms:
        return synonyms[key]
    lowered = {n.lower(): n for n in names}
    if key in lowered:
        return lowered[key]
    match = difflib.get_close_matches(key, list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


def unknown_choice(
    kind: str, value: object, valid: Iterable[str], synonyms: Mapping[str, str] | None = None
) -> str:
    """The one message for an unknown name: what was given, the closest valid one, and every valid one."""
    names = list(dict.fromkeys(valid))
    guess = closest(value, names, synonyms)
    mean = f" (did you mean {guess!r}?)" if guess else ""
    return f"unknown {kind} {str(value)[:80]!r}{mean}; valid: {', '.join(names)}"


def replace_checked(
    cfg: _Config, what: str, changes: Mapping[str, object], error: type[ModelExportError] = ConfigError
) -> _Config:
    """A frozen dataclass config with ``changes``: an unknown field is refused as ``error`` (a builtin
    ``ValueError`` too) naming the closest valid one, where ``dataclasses.replace`` would raise a bare
    ``TypeError`` about ``__init__``."""
    valid = [f.name for f in fields(cfg)]  # type: ignore[arg-type]
    for name in changes:
        if name not in valid:
            raise error(
                unknown_choice(f"{what} option", name, valid), hint=f"pass one of the {what} options listed"
            )
    return replace(cfg, **changes)  # type: ignore[type-var]
