"""Inference on exported models: processors shaped by the graph, and auto-detecting task pipelines."""

from __future__ import annotations

from .pipelines import PIPELINES, ONNXPipeline, create_pipeline, pipeline, register_pipeline
from .processors import (
    ONNXAutoProcessor,
    ONNXFeatureExtractor,
    ONNXImageProcessor,
    ONNXProcessor,
    ONNXTokenizer,
)

__all__ = [
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
