"""Processors: raw texts, images and audio -> feeds shaped for the graph (pad/crop to fixed dims)."""

from __future__ import annotations

from .audio import ONNXFeatureExtractor, read_audio
from .auto import PROCESSORS, ONNXAutoProcessor, ONNXProcessor, ProcessorSources, register_processor
from .base import BaseONNXProcessor
from .fast_tokenizer import FastTokenizer
from .image import ONNXImageProcessor, to_array
from .text import ONNXTokenizer, load_tokenizer
from .vision_text import ONNXVisionTextProcessor, load_rgb

__all__ = [
    "BaseONNXProcessor",
    "FastTokenizer",
    "ONNXAutoProcessor",
    "ONNXFeatureExtractor",
    "ONNXImageProcessor",
    "ONNXProcessor",
    "ONNXTokenizer",
    "ONNXVisionTextProcessor",
    "PROCESSORS",
    "ProcessorSources",
    "load_rgb",
    "load_tokenizer",
    "read_audio",
    "register_processor",
    "to_array",
]
