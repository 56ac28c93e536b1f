"""Run a page's examples in order in one working directory, as a reader would type them.

``modelexport`` commands (and ``python pipeline.py``, ``python -m modelexport``) run in this process through
the CLI's ``main`` with ``COLUMNS=100``, and every line they print is measured. Python blocks run in one
namespace per page, like a notebook. Commands that install or build are checked, not run.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from .blocks import Block, Page, commands

__all__ = ["Runner", "MAX_COLUMNS", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]
MAX_COLUMNS = 100
#: Shell commands a page may run as they are (they read files in the working directory).
_PLAIN = {"ls", "cat", "head", "wc", "python", "export"}
#: Commands checked against the repository (targets, extras, scripts), never run by a test.
_CHECKED = {"pip", "make", "git", "model-explorer", "cd", "mkdocs"}
_MACHINE_FLAGS = re.compile(r"(--json\b|--format[ =](json|csv)\b|-o\s+\S+\.(json|csv)\b)")


@dataclass
class Measured:
    """Every modelexport command a run printed text for, and its widest line."""

    commands: dict[str, int] = field(default_factory=dict)


class Runner:
    """Runs the blocks of one page in ``folder``."""

    def __init__(self, page: Page, folder: Path, measured: Measured, include_slow: bool) -> None:
        self.page, self.folder, self.measured, self.include_slow = page, folder, measured, include_slow
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}

    # ------------------------------------------------------------------------------------------- blocks
    def run(self) -> None:
        for block in self.page.blocks:
            if block.mode == "slow" and not self.include_slow:
                continue
            if block.mode == "file":
                target = self.folder / block.argument
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text + "\n", encoding="utf-8")
            elif block.kind == "python":
                self._python(block)
            else:
                expected = int(block.argument) if block.mode == "exit" else 0
                for command in commands(block.text):
                    self._shell(block, command, expected, parse_only=block.mode == "check")

    def _python(self, block: Block) -> None:
        """As ``python`` started in the working directory: its files import (``from model import make_cnn``).
        A ``check`` block (it needs what a test machine lacks) is compiled, not run."""
        code = compile(block.text, f"{self.page.path}:{block.line}", "exec")
        if block.mode == "check":
            return
        with _cwd(self.folder), _importable(self.folder), contextlib.redirect_stdout(io.StringIO()):
            exec(code, self.namespace)  # noqa: S102 - the documentation's own example

    # ------------------------------------------------------------------------------------------ commands
    def _shell(self, block: Block, command: str, expected: int, parse_only: bool) -> None:
        args = shlex.split(command, comments=True)
        if not args:
            return
        program = args[0]
        if program in _CHECKED:
            return _check_static(block, args)
        if parse_only and program != "modelexport" and args[1:3] != ["-m", "modelexport"]:
            return None  # a check block's other commands (a venv, a shell) are shown, not run
        if program == "modelexport":
            return self._modelexport(block, args[1:], expected, parse_only)
        if program == "python" and args[1:3] == ["-m", "modelexport"]:
            return self._modelexport(block, args[3:], expected, parse_only)
        if program == "python" and len(args) > 1 and args[1].endswith("pipeline.py"):
            return self._modelexport(block, ["pipeline", *args[2:]], expected, parse_only)
        if program == "python" and len(args) > 1 and args[1].startswith("benchmarks/"):
            assert (ROOT / args[1]).is_file(), f"{block.label}: no such benchmark {args[1]}"
            return None
        if program == "python" and len(args) > 1:
            return self._script(block, args[1:])
        assert program in _PLAIN, f"{block.label}: the docs' tests do not know how to run {program!r}"
        proc = subprocess.run(args, cwd=self.folder, capture_output=True, text=True, timeout=120)
        assert proc.returncode == expected, f"{block.label}: {command}\n{proc.stderr}"
        return None

    def _script(self, block: Block, args: list[str]) -> None:
        with (
            _cwd(self.folder),
            _importable(self.folder),
            _argv(args),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            runpy.run_path(args[0], run_name="__main__")

    def _modelexport(self, block: Block, args: list[str], expected: int, parse_only: bool) -> None:
        from modelexport.cli.app import main

        if parse_only:  # every option is parsed against the command's own (unknown ones fail), nothing runs
            args = [a for a in args if a not in ("-h", "--help")]
            with _cwd(self.folder), _captured() as (out, err):
                code = main([*args, "--help"])
            assert code == 0, f"{block.label}: modelexport {shlex.join(args)}\n{err.getvalue()}"
            return
        with _cwd(self.folder), _captured() as (out, err), _cli_log_lines(err):
            code = main(args)
        text = out.getvalue() + err.getvalue()
        where = f"{block.label}: modelexport {shlex.join(args)}"
        assert code == expected, f"{where} exited {code}, expected {expected}\n{text}"
        if not _MACHINE_FLAGS.search(shlex.join(args)) and args:
            wide = [line for line in text.splitlines() if len(line) > MAX_COLUMNS]
            assert not wide, f"{where}: lines wider than {MAX_COLUMNS} columns:\n" + "\n".join(wide)
            name = next((a for a in args if not a.startswith("-")), "")
            self.measured.commands[name] = max(
                self.measured.commands.get(name, 0), max((len(x) for x in text.splitlines()), default=0)
            )


def _check_static(block: Block, args: list[str]) -> None:
    """``make TARGET`` names a Makefile target; ``pip install '.[a,b]'`` names extras pyproject.toml has."""
    if args[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        for target in (a for a in args[1:] if "=" not in a and not a.startswith("-")):
            assert target in targets, f"{block.label}: no make target {target!r}"
    if args[0] == "pip":
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for arg in args:
            for group in re.findall(r"\[([\w,-]+)\]", arg):
                unknown = set(group.split(",")) - extras
                assert not unknown, f"{block.label}: no extra {sorted(unknown)} in pyproject.toml"


@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _importable(folder: Path) -> Iterator[None]:
    """``folder`` on ``sys.path``; modules imported from it are forgotten afterwards (pages share names)."""
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(folder)):
                del sys.modules[name]


@contextlib.contextmanager
def _argv(args: list[str]) -> Iterator[None]:
    before = sys.argv
    sys.argv = list(args)
    try:
        yield
    finally:
        sys.argv = before


@contextlib.contextmanager
def _cli_log_lines(stream: io.StringIO) -> Iterator[None]:
    """The log lines the CLI prints on stderr (pytest owns the root logger's handlers, so the CLI adds none
    here): written to ``stream`` as the CLI's handler writes them, so they are measured too."""
    import logging

    from modelexport.cli.display import LogFormatter

    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogFormatter())
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err
