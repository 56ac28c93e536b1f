"""Progress that suits where it goes: tqdm bars on a terminal, a few plain lines in a log.

A tqdm bar written to a file or a pipe is thousands of carriage-return updates on one line. Off a terminal
:func:`progress_bar` gives a :class:`LineProgress` instead: it prints one line when a bar has run for
:data:`HEARTBEAT_S` seconds since the last progress line of any bar or stage (so a long command shows
where it is within seconds, and a short one prints nothing), and one closing line for bars that ``leave``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["progress_bar", "LineProgress", "is_terminal", "note_progress_line", "HEARTBEAT_S"]

#: Seconds without a progress line after which a running bar off a terminal prints where it is.
HEARTBEAT_S = 5.0

_LAST_LINE = {"at": time.monotonic()}


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr, where progress goes) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def note_progress_line() -> None:
    """Record that a progress line was just written (stage lines count too): the heartbeat restarts."""
    _LAST_LINE["at"] = time.monotonic()


class LineProgress:
    """The part of tqdm's interface our bars use, written as a few whole lines (for logs and pipes)."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        leave: bool = True,
        disable: bool = False,
        file: TextIO | None = None,
        **_: object,
    ) -> None:
        self.iterable = iterable
        self.total = total if total is not None else _length(iterable)
        self.desc, self.unit, self.leave, self.disable = desc, unit, leave, disable
        self.file = file
        self.n = 0
        self.postfix = ""
        self.start = time.monotonic()
        self._closed = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        if not self.disable and time.monotonic() - _LAST_LINE["at"] >= HEARTBEAT_S:
            self._write()

    def set_postfix(
        self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: object
    ) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        """Nothing to redraw: lines are written whole."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.disable and self.leave and self.n:
            self._write()

    def _write(self) -> None:
        total = f"/{self.total:g}" if self.total else ""
        extra = f", {self.postfix}" if self.postfix else ""
        line = f"{self.desc}: {self.n:g}{total} {self.unit} in {time.monotonic() - self.start:.0f} s{extra}"
        print(line.lstrip(": "), file=self.file or sys.stderr, flush=True)
        note_progress_line()


def _length(iterable: Iterable[Any] | None) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def progress_bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A tqdm bar on a terminal, a :class:`LineProgress` elsewhere (same arguments: total, desc, unit...)."""
    if is_terminal(kwargs.get("file")):
        from tqdm.auto import tqdm

        return tqdm(iterable, **kwargs)
    return LineProgress(iterable, **kwargs)
