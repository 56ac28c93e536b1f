"""``StageLog``: the stage timer behind export's report and the CLI's stage lines.

Loops over items (training epochs, calibration batches, Ray blocks) show tqdm bars instead
(:func:`modelexport._progress.progress_bar`).

Each stage's start and end go to a logger at INFO (``--log-level info`` shows where a long command is and
where its time went); an optional callback, and every listener registered with :func:`stage_listener` (the
CLI's progress display), hear each stage's name as it starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StageLog", "stage_listener", "announce"]

#: Called with each stage's name as it starts, in any StageLog of the process (see :func:`stage_listener`).
_LISTENERS: list[Callable[[str], None]] = []


@contextmanager
def stage_listener(listener: Callable[[str], None]) -> Iterator[None]:
    """Hear every stage that starts while the block runs (the CLI shows them as progress)."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def announce(stage: str) -> None:
    """Tell the listeners a step has started (a step not timed by a StageLog: starting a Ray cluster)."""
    for listener in list(_LISTENERS):
        listener(stage)


@dataclass
class StageLog:
    """Each stage's status, seconds and a short detail, in order."""

    stages: list[dict[str, Any]] = field(default_factory=list)
    on_stage: Callable[[str], None] | None = None  # progress callback: called with each stage's name
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("modelexport"))

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, Any]]:
        entry = {"stage": name, "status": "running", "seconds": 0.0, "detail": detail}
        self.stages.append(entry)
        for listener in [self.on_stage, *_LISTENERS]:
            if listener is not None:
                listener(name)
        self.logger.info("%s ...%s", name, f" ({detail})" if detail else "")
        start = time.perf_counter()
        try:
            yield entry
        except BaseException:
            entry["status"] = "failed"
            raise
        else:
            if entry["status"] == "running":
                entry["status"] = "ok"
        finally:
            entry["seconds"] = round(time.perf_counter() - start, 4)
            done = entry["detail"] if entry["detail"] != detail else ""
            self.logger.info(
                "%s %s in %.2f s%s", name, entry["status"], entry["seconds"], f": {done}" if done else ""
            )

    def skip(self, name: str, why: str) -> None:
        self.stages.append({"stage": name, "status": "skipped", "seconds": 0.0, "detail": why})
        self.logger.info("%s skipped: %s", name, why)

    def seconds(self) -> dict[str, float]:
        return {s["stage"]: s["seconds"] for s in self.stages}
