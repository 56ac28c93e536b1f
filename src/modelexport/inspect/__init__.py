"""Inspect tagged ONNX models: analyze, validate, compare, extract a module, profile per module.

Every entry point takes a path, an export folder or a ``ModelProto``; the hierarchy sidecar is used
when it is beside the model and is never required (the tags live in the ONNX nodes).
"""

from __future__ import annotations

from .analyze import Analysis, AnalyzeConfig, analyze
from .compare import Comparison, compare
from .loading import TaggedModel, load_tagged_model
from .profile import ProfileConfig, ProfileResult, profile
from .validate import ValidationReport, repair, validate

__all__ = [
    "AnalyzeConfig",
    "Analysis",
    "Comparison",
    "ProfileConfig",
    "ProfileResult",
    "TaggedModel",
    "ValidationReport",
    "analyze",
    "compare",
    "load_tagged_model",
    "profile",
    "repair",
    "validate",
]
