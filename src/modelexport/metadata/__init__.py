"""Self-describing ONNX: schema-2.0 metadata (embed, read, verify, edit), task detection, Optimum package."""

from __future__ import annotations

from .schema import METADATA_VERSION
from .store import clear_cache, read_metadata, resolve_model_file, update_metadata, write_metadata
from .tasks import TASKS, TaskSpec, detect_task, normalize_task, register_task

__all__ = [
    "METADATA_VERSION",
    "read_metadata",
    "update_metadata",
    "write_metadata",
    "resolve_model_file",
    "clear_cache",
    "TASKS",
    "TaskSpec",
    "detect_task",
    "normalize_task",
    "register_task",
    "validate_optimum_compatibility",
    "OptimumCompatibility",
]


def __getattr__(name: str):  # Optimum checks import transformers lazily
    if name in ("validate_optimum_compatibility", "OptimumCompatibility"):
        from . import optimum

        return getattr(optimum, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
