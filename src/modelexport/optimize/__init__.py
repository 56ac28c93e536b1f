"""Optimize for inference: int8 quantization and graph optimization that keep tags and metadata.

Every transform is a pass followed by :func:`retag` (tags restored from the graph before it), then
metadata and the sidecar are carried over. Heavy dependencies load only when a pass runs.
"""

from __future__ import annotations

from .config import OptimizeConfig, QuantizeConfig
from .graph import GRAPH_PASSES, OptimizeResult, optimize_model
from .quantization import QUANT_MODES, QuantizeResult, quantize
from .retag import RetagResult, retag, tag_coverage

__all__ = [
    "GRAPH_PASSES",
    "QUANT_MODES",
    "OptimizeConfig",
    "OptimizeResult",
    "QuantizeConfig",
    "QuantizeResult",
    "RetagResult",
    "optimize_model",
    "quantize",
    "retag",
    "tag_coverage",
]
