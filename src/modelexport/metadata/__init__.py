"""Self-describing ONNX: schema-2.0 metadata (embed, read, verify, edit), task detection, Optimum package."""

from __future__ import annotations

from .schema import METADATA_VERSION
from .store import clear_cache, read_metadata, update_metadata, write_metadata
from .tasks import TASKS, TaskSpec, detect_task, normalize_task

__all__ = [
    "METADATA_VERSION",
    "read_metadata",
    "update_metadata",
    "write_metadata",
    "clear_cache",
    "TASKS",
    "TaskSpec",
    "detect_task",
    "normalize_task",
]
