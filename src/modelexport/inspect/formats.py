"""Output formats of the inspect commands: one registry of renderers per (command, format).

A renderer turns a result object into text. Adding a format is one decorated function; the CLI's
``--format`` choices and the ``--output`` extension mapping both come from this registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._registry import Registry
from ..errors import ConfigError

__all__ = [
    "renderer",
    "render",
    "formats_for",
    "format_for_path",
    "fit_width",
    "TERMINAL_WIDTH",
    "MACHINE_FORMATS",
]

#: Text output fits a terminal this wide unless the user asks for ``--wide``.
TERMINAL_WIDTH = 100
#: Formats read by programs: never cut.
MACHINE_FORMATS = frozenset({"json", "csv"})

#: ``command:format`` -> ``fn(result) -> str``.
_RENDERERS: Registry[Callable[[Any], str]] = Registry("format")
_EXTENSIONS = {".json": "json", ".csv": "csv", ".md": "markdown", ".txt": "summary"}


def renderer(command: str, fmt: str) -> Callable[[Callable[[Any], str]], Callable[[Any], str]]:
    """Register ``fn(result) -> str`` as the ``fmt`` output of ``command``."""
    return _RENDERERS.register(f"{command}:{fmt}")


def formats_for(command: str) -> list[str]:
    return [key.split(":", 1)[1] for key in _RENDERERS if key.split(":", 1)[0] == command]


def fit_width(text: str, width: int) -> str:
    """Each line cut to ``width`` columns, the cut marked with an ellipsis."""
    return "\n".join(ln if len(ln) <= width else ln[: width - 1] + "\u2026" for ln in text.split("\n"))


def render(command: str, fmt: str, result: Any, width: int | None = None) -> str:
    """``result`` as ``fmt``; human formats are cut to ``width`` columns when given (``--wide``: None)."""
    fn = _RENDERERS.find(f"{command}:{fmt}")
    if fn is None:
        raise ConfigError(f"unknown format {fmt!r} for {command}; valid: {', '.join(formats_for(command))}")
    text = fn(result)
    return fit_width(text, width) if width and fmt not in MACHINE_FORMATS else text


def file_name_for(command: str, fmt: str) -> str:
    """The file a ``command -o DIR/`` writes in the folder: ``analyze.json``, ``compare.md``, ``profile.txt``."""
    suffix = next((ext for ext, f in _EXTENSIONS.items() if f == fmt), ".txt")
    return f"{command}{suffix}"


def format_for_path(command: str, path: str, default: str) -> str:
    """The format an output file's extension asks for (``.json`` -> json), if the command has it."""
    from pathlib import Path

    fmt = _EXTENSIONS.get(Path(path).suffix.lower(), default)
    return fmt if f"{command}:{fmt}" in _RENDERERS else default
