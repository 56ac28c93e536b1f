"""State passed between the stages of one export; its stages are timed and logged by :class:`StageLog`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._stages import StageLog
from ..onnxfile import DEFAULT_MODEL_FILE
from .config import ExportConfig
from .inputs import ExampleInputs
from .loading import LoadedModel

__all__ = ["ExportContext", "StageLog", "EXPORT_LOG"]

#: Where an export's stage lines go (``INFO modelexport.export: capture ok in 5.69 s``).
EXPORT_LOG = logging.getLogger("modelexport.export")


def _export_stages() -> StageLog:
    return StageLog(logger=EXPORT_LOG)


@dataclass
class ExportContext:
    """Everything one export knows; package passes read and extend it."""

    config: ExportConfig
    loaded: LoadedModel
    inputs: ExampleInputs
    model_proto: Any
    staging_dir: Path
    #: The graph's file name in the package (``model.onnx``; ``encoder_model.onnx``... for several graphs).
    model_file: str = DEFAULT_MODEL_FILE
    tree: Any = None
    tagging: Any = None
    tokenizer: Any = None
    reference: list[tuple[str, Any]] = field(default_factory=list)
    stages: StageLog = field(default_factory=_export_stages)
    files: dict[str, str] = field(default_factory=dict)  # role -> file name inside the package
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # passes share results here (task, metadata, ...)
