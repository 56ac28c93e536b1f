"""State of one graph's export between its stages; its stages are timed and logged by :class:`StageLog`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .._stages import StageLog
from ..hierarchy.tagger import TaggingResult
from ..hierarchy.tree import ModuleTree
from ..onnxfile import DEFAULT_MODEL_FILE
from .config import ExportConfig
from .inputs import ExampleInputs
from .loading import LoadedModel

if TYPE_CHECKING:
    import onnx
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["ExportContext", "StageLog", "EXPORT_LOG"]

#: Where an export's stage lines go (``INFO modelexport.export: capture ok in 5.69 s``).
EXPORT_LOG = logging.getLogger("modelexport.export")


def _export_stages() -> StageLog:
    return StageLog(logger=EXPORT_LOG)


@dataclass
class ExportContext:
    """What the stages of one graph's export share: the model, its inputs and the graph as the stages
    build it (reference outputs, module tree, tags), and the files and notes the export reports. What the
    package steps produce travels in their own typed state (:class:`modelexport.export.package.PackageState`)."""

    config: ExportConfig
    loaded: LoadedModel
    inputs: ExampleInputs
    model_proto: onnx.ModelProto | None
    staging_dir: Path
    #: The graph's file name in the package (``model.onnx``; ``encoder_model.onnx``... for several graphs).
    model_file: str = DEFAULT_MODEL_FILE
    tree: ModuleTree | None = None
    tagging: TaggingResult | None = None
    tokenizer: PreTrainedTokenizerBase | None = None
    reference: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    stages: StageLog = field(default_factory=_export_stages)
    files: dict[str, str] = field(default_factory=dict)  # role -> file name inside the package
    notes: list[str] = field(default_factory=list)
