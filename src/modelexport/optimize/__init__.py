"""Optimize for inference: int8 quantization, weight-only int4/int8 quantization (``MatMulNBits``) and graph
optimization that keep tags and metadata.

Every transform is a pass (``hierarchy.passes``: ModelProto -> PassResult) run inside
:class:`Retagged` (tags restored from the graph before it), then metadata and the sidecar are
carried over. Configs have named presets (``QuantizeConfig.preset("avx512_vnni")``,
``OptimizeConfig.preset("O2")``, ``WeightOnlyConfig.preset("int4")``). Heavy dependencies load only when a pass runs.
"""

from __future__ import annotations

from .config import (
    OPTIMIZE_PRESETS,
    QUANT_MODES,
    QUANTIZE_PRESETS,
    WEIGHT_ALGORITHMS,
    WEIGHT_PRESETS,
    OptimizeConfig,
    QuantizeConfig,
    WeightOnlyConfig,
)
from .graph import GRAPH_PASSES, GraphPass, OptimizeResult, graph_passes, optimize_model
from .quantization import QuantizeResult, quantize
from .retag import Retagged, RetagPass, RetagResult, retag, tag_coverage

__all__ = [
    "GRAPH_PASSES",
    "OPTIMIZE_PRESETS",
    "QUANTIZE_PRESETS",
    "QUANT_MODES",
    "WEIGHT_ALGORITHMS",
    "WEIGHT_PRESETS",
    "WeightOnlyConfig",
    "GraphPass",
    "OptimizeConfig",
    "OptimizeResult",
    "QuantizeConfig",
    "QuantizeResult",
    "RetagPass",
    "RetagResult",
    "Retagged",
    "graph_passes",
    "optimize_model",
    "quantize",
    "retag",
    "tag_coverage",
]
