"""What the CLI prints: lines that fit the terminal (100 columns at most), numbers in one format, progress.

Every command's text output goes through :func:`echo`. On a terminal, or wherever ``COLUMNS`` says how wide
the output is, a line longer than that (at most 100) is wrapped at its spaces (lists, sentences, error
messages) with its continuation indented; in a pipe or a log without ``COLUMNS`` such lines stay whole, one
line per message for grep. Tables (``wrap=False``) are cut at the width everywhere, 100 columns in a log. A
value cut with ``…`` gets one line on stderr naming the option that prints it whole (``--json``,
``--format json``, ``--wide``). Machine formats (JSON, CSV) are printed as they are.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

import click

from .._progress import is_terminal, note_progress_line
from .._stages import stage_listener

__all__ = [
    "MAX_COLUMNS",
    "columns",
    "fitting",
    "fit",
    "echo",
    "message",
    "diff",
    "shorten",
    "progress",
    "WrappedStream",
    "LogFormatter",
    "LOG_FORMAT",
]

#: No line of text output is wider than this, whatever the terminal (a log file gets this width).
MAX_COLUMNS = 100
_MIN_COLUMNS = 40
_ELLIPSIS = "\u2026"
#: A command that runs longer than this shows where it is (stage lines off a terminal).
PROGRESS_DELAY_S = 2.0


def columns() -> int:
    """The width text output fits: ``COLUMNS`` or the terminal's, at most :data:`MAX_COLUMNS`."""
    width = shutil.get_terminal_size((MAX_COLUMNS, 24)).columns
    return max(_MIN_COLUMNS, min(width, MAX_COLUMNS))


def fitting(stream: TextIO | None = None) -> bool:
    """Whether lines written to ``stream`` (default stdout) are fitted to a width: on a terminal, or when
    ``COLUMNS`` is set (a log keeps each line whole unless it asks)."""
    return "COLUMNS" in os.environ or is_terminal(stream if stream is not None else sys.stdout)


def message(text: str) -> str:
    """An error or warning line for stderr: wrapped where :func:`fitting`, else one whole line."""
    return fit(text)[0] if fitting(sys.stderr) else text


#: How the CLI prints a log record: ``WARNING modelexport.runtime.session: ...``.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


class LogFormatter(logging.Formatter):
    """Log lines as the CLI's other messages: wrapped where :func:`fitting`, else whole."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return message(super().format(record))


def shorten(value: str, width: int) -> str:
    """``value`` cut to ``width`` characters, the cut marked with ``…``."""
    return value if len(value) <= width else value[: max(width - 1, 0)] + _ELLIPSIS


def _wrap(line: str, width: int) -> list[str]:
    indent = line[: len(line) - len(line.lstrip(" "))]
    wrapper = textwrap.TextWrapper(
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapper.wrap(line.strip()) or [line]


def fit(text: str, width: int | None = None, *, wrap: bool = True) -> tuple[str, bool]:
    """``text`` with every line at most ``width`` columns, and whether a value had to be cut.

    ``wrap``: break long lines at spaces first (summaries); without it (tables, where a wrapped row would
    break the columns) a long line is cut.
    """
    width = width or columns()
    out: list[str] = []
    cut = False
    for line in text.split("\n"):
        pieces = _wrap(line, width) if wrap and len(line) > width else [line]
        for piece in pieces:
            cut = cut or len(piece) > width
            out.append(shorten(piece, width))
    return "\n".join(out), cut


def echo(text: str, *, more: str | None = None, wrap: bool = True, err: bool = False) -> None:
    """Print ``text`` fitted to the terminal; if a value was cut, say on stderr which option prints it whole.

    ``wrap``: a summary, wrapped where :func:`fitting` (else printed whole); without it, a table or a value
    list, cut at the width everywhere."""
    if wrap and not fitting(sys.stderr if err else sys.stdout):
        click.echo(text.rstrip("\n"), err=err)
        return
    fitted, cut = fit(text.rstrip("\n"), wrap=wrap)
    click.echo(fitted, err=err)
    if cut and more:
        click.echo(f"(long values were cut at {columns()} columns: {more} prints them whole)", err=True)


def diff(value: float) -> str:
    """A difference (parity, max abs diff, error) with 3 significant digits: ``1.04e-07``, ``0.0123``."""
    return f"{value:.3g}"


@contextmanager
def progress(title: str, *, spinner: bool = True) -> Iterator[Callable[[str], None]]:
    """Show where a long command is; yields ``update(stage)``, and library stages are shown too.

    On a terminal with ``spinner``: one status line, updated in place. Otherwise (a log, a pipe, or a
    command that draws progress bars of its own): lines on stderr, from :data:`PROGRESS_DELAY_S` seconds
    on (the stage running then, and each later stage), so a quick command prints none.
    """
    title = shorten(title, columns() - 4)
    if spinner and is_terminal():
        from rich.console import Console

        with Console(stderr=True).status(f"{title}...") as status:

            def update(stage: str) -> None:
                status.update(shorten(f"{title}: {stage}...", columns() - 4))

            with stage_listener(update):
                yield update
        return
    lines = _DelayedLines(title)
    try:
        with stage_listener(lines.stage):
            yield lines.stage
    finally:
        lines.stop()


class _DelayedLines:
    """Stage lines that start once a command has run :data:`PROGRESS_DELAY_S` seconds."""

    def __init__(self, title: str) -> None:
        self.title, self.current, self.started = title, "", False
        self.lock = threading.Lock()
        self.timer = threading.Timer(PROGRESS_DELAY_S, self._start)
        self.timer.daemon = True
        self.timer.start()

    def _write(self) -> None:
        text = f"{self.title}: {self.current}" if self.current else f"{self.title}..."
        click.echo(shorten(text, columns()), err=True)
        note_progress_line()

    def _start(self) -> None:
        with self.lock:
            self.started = True
            self._write()

    def stage(self, name: str) -> None:
        with self.lock:
            self.current = name
            if self.started:
                self._write()

    def stop(self) -> None:
        self.timer.cancel()


class WrappedStream:
    """Text that arrives in pieces (generated tokens), printed as it comes and wrapped at the terminal's width:
    a piece that would cross it starts an indented line (at its space, when it has one)."""

    def __init__(self, column: int, indent: str = "    ") -> None:
        self.column, self.indent, self.started = column, indent, False
        self.width = columns() if fitting() else 1 << 30  # a log keeps the text on one line

    def __call__(self, text: str) -> None:
        if not self.started:
            text, self.started = text.lstrip(), True
        for i, piece in enumerate(text.split("\n")):
            if i:
                click.echo("")
                self.column = 0
            while self.column + len(piece) > self.width:
                room = self.width - self.column
                cut = piece.rfind(" ", 0, room + 1) if self.column > len(self.indent) else room
                head = piece[: max(cut, 0)]
                click.echo(head, nl=False)
                click.echo("\n" + self.indent, nl=False)
                self.column = len(self.indent)
                piece = piece[len(head) :].lstrip()
            click.echo(piece, nl=False)
            self.column += len(piece)


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (generated text is streamed there as it comes)."""
    return is_terminal(sys.stdout)
