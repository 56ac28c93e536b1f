"""State passed between the stages of one export, and the stage timer behind the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ExportConfig
from .inputs import ExampleInputs
from .loading import LoadedModel

__all__ = ["ExportContext", "StageLog"]


@dataclass
class StageLog:
    """Each stage's status, seconds and a short detail, in order."""

    stages: list[dict[str, Any]] = field(default_factory=list)
    on_stage: Callable[[str], None] | None = None  # progress callback: called with each stage's name

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, Any]]:
        entry = {"stage": name, "status": "running", "seconds": 0.0, "detail": detail}
        self.stages.append(entry)
        if self.on_stage is not None:
            self.on_stage(name)
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

    def skip(self, name: str, why: str) -> None:
        self.stages.append({"stage": name, "status": "skipped", "seconds": 0.0, "detail": why})

    def seconds(self) -> dict[str, float]:
        return {s["stage"]: s["seconds"] for s in self.stages}


@dataclass
class ExportContext:
    """Everything one export knows; package passes read and extend it."""

    config: ExportConfig
    loaded: LoadedModel
    inputs: ExampleInputs
    model_proto: Any
    staging_dir: Path
    tree: Any = None
    tagging: Any = None
    tokenizer: Any = None
    reference: list[tuple[str, Any]] = field(default_factory=list)
    stages: StageLog = field(default_factory=StageLog)
    files: dict[str, str] = field(default_factory=dict)  # role -> file name inside the package
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # passes share results here (task, metadata, ...)
