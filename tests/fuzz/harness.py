"""Run CLI commands on a (mutated) model in-process or as a subprocess and check the outcome contract.

The contract (issue 12): exit code 0 or 1 (never 3 "looks like a bug", never a signal), no traceback,
completion within a time bound, and no new files in the model's folder when the command failed. Issue 31 adds:
a transform (quantize, optimize) that succeeds has verified the metadata it carried (:func:`laundered`).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Outcome",
    "COMMANDS",
    "TRANSFORMS",
    "run_inprocess",
    "run_subprocess",
    "problems",
    "laundered",
    "snapshot",
]

#: command name -> argv after the model path ({img}: a small PNG, {ref}: the intact model, {out}: folder)
COMMANDS: dict[str, list[str]] = {
    "analyze": ["analyze", "{model}"],
    "validate": ["validate", "{model}"],
    "metadata": ["metadata", "{model}"],
    "infer": ["infer", "{model}", "--image", "{img}"],
    "compare": ["compare", "{model}", "{ref}"],
    "extract": ["extract", "{model}", "--list"],
    "profile": ["profile", "{model}", "--runs", "1", "--warmup", "0"],
    "quantize": ["quantize", "{model}", "-o", "{out}/q.onnx", "--format", "json"],
    "optimize": ["optimize", "{model}", "-o", "{out}/o.onnx", "--format", "json"],
}
#: Commands that carry the input's metadata into a new, signed file.
TRANSFORMS = ("quantize", "optimize")


class _TimeUp(BaseException):
    """Raised by the alarm; a BaseException so the CLI's error handler does not turn it into exit 1."""


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    output: str
    seconds: float
    timed_out: bool = False


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise _TimeUp()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_inprocess(argv: list[str], limit_s: float) -> Outcome:
    """``modelexport.cli.app.main(argv)`` with stdout/stderr captured, stopped after ``limit_s``."""
    from modelexport.cli.app import main

    buf = io.StringIO()
    start = time.perf_counter()
    code: int | None = None
    timed_out = False
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            with _alarm(limit_s):
                code = main(argv)
        except _TimeUp:
            timed_out = True
        except SystemExit as exc:  # click may exit on its own for --help/usage
            code = exc.code if isinstance(exc.code, int) else 1
    return Outcome(argv, code, buf.getvalue(), time.perf_counter() - start, timed_out)


def run_subprocess(argv: list[str], limit_s: float) -> Outcome:
    """The installed CLI as a child process; a negative code is the signal that ended it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "modelexport.cli.app", *argv],
            capture_output=True,
            text=True,
            timeout=limit_s,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        return Outcome(argv, None, out or "", time.perf_counter() - start, True)
    return Outcome(argv, proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start)


def snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def problems(outcome: Outcome, before: set[str], after: set[str]) -> list[str]:
    """What about ``outcome`` breaks the contract (empty when it is fine)."""
    found = []
    if outcome.timed_out:
        found.append(f"no answer within {outcome.seconds:.0f} s")
    elif outcome.code not in (0, 1):
        found.append(f"exit code {outcome.code}")
    if "Traceback" in outcome.output or "looks like a bug" in outcome.output:
        found.append("traceback / 'looks like a bug' in the output")
    if outcome.code != 0 and after - before:
        found.append(f"new files after a failure: {sorted(after - before)}")
    return found


def laundered(command: str, model: Path, outcome: Outcome) -> list[str]:
    """A transform that succeeded on a model whose metadata fails verification signed what it did not verify."""
    from modelexport.errors import MetadataError
    from modelexport.metadata import clear_cache, read_metadata

    if command not in TRANSFORMS or outcome.code != 0:
        return []
    clear_cache()
    try:
        read_metadata(model)
    except MetadataError as exc:
        return [f"carried metadata that does not verify ({str(exc)[:80]}) into its output"]
    except Exception:  # noqa: BLE001 - another reason the file does not read; problems() judges the outcome
        return []
    return []
