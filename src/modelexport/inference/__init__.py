"""Inference on exported models: processors, auto-detecting task pipelines, and evaluation on labelled data."""

from __future__ import annotations

from .evaluate import EvaluationResult, evaluate
from .pipelines import PIPELINES, ONNXPipeline, create_pipeline, pipeline, register_pipeline
from .processors import (
    ONNXAutoProcessor,
    ONNXFeatureExtractor,
    ONNXImageProcessor,
    ONNXProcessor,
    ONNXTokenizer,
)

__all__ = [
    "EvaluationResult",
    "evaluate",
    "PIPELINES",
    "ONNXPipeline",
    "create_pipeline",
    "pipeline",
    "register_pipeline",
    "ONNXAutoProcessor",
    "ONNXFeatureExtractor",
    "ONNXImageProcessor",
    "ONNXProcessor",
    "ONNXTokenizer",
]
