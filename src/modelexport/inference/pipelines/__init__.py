"""Task pipelines on ONNX Runtime, one registry; output formats follow transformers' pipelines."""

from __future__ import annotations

from . import generation as _generation  # noqa: F401 - registers text-generation
from . import seq2seq as _seq2seq  # noqa: F401 - registers text2text-generation, speech recognition
from . import text as _text  # noqa: F401 - registers the text tasks
from . import vision as _vision  # noqa: F401 - registers the image and audio tasks
from . import vlm as _vlm  # noqa: F401 - registers image-text-to-text
from .base import PIPELINES, ONNXPipeline, register_pipeline
from .factory import PROCESSOR_ARGS, create_pipeline, pipeline, resolve_task

__all__ = [
    "PIPELINES",
    "ONNXPipeline",
    "register_pipeline",
    "pipeline",
    "create_pipeline",
    "resolve_task",
    "PROCESSOR_ARGS",
]
