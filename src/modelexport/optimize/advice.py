"""One line of advice when a quantized model measured on ``--eval-data`` is poor: what was wrong, what to try.

A check of the evaluation ``quantize`` already made (:attr:`QuantizeResult.evaluation`), kept apart from the
quantizers: poor means the outputs drifted (mean cosine to fp32 below :data:`MIN_COSINE`) or the int8 model
ran slower than fp32 (speedup below 1). Static int8 on all-MiniLM-L6-v2 measured cosine 0.715 and 0.14x
fp32's speed; dynamic per-channel int8 gives 0.991 and 2x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import OptimizeConfig, QuantizeConfig, WeightOnlyConfig

__all__ = ["MIN_COSINE", "quantization_advice"]

#: Below this mean cosine (quantized vs fp32 outputs) the quantized model is called poor.
MIN_COSINE = 0.95


def _fixes(config: QuantizeConfig | WeightOnlyConfig | OptimizeConfig | None, drifted: bool) -> str:
    """What to try instead, for the settings that ran."""
    mode = getattr(config, "mode", None)
    if mode == "static":
        return "try --mode dynamic --per-channel"
    if drifted and str(mode).startswith("weights_"):  # WeightOnlyConfig.mode: weights_int4, weights_int8
        return "try --mixed-precision norm_inputs or --weights int8"
    if drifted and mode == "dynamic" and not getattr(config, "per_channel", False):
        return "try --per-channel, or --exclude-modules"
    if drifted:
        return "keep modules in float with --exclude-modules (--error-report)"
    return "deploy fp32, or try `modelexport optimize -O2`"


def quantization_advice(
    evaluation: dict[str, Any] | None,
    config: QuantizeConfig | WeightOnlyConfig | OptimizeConfig | None = None,
) -> str | None:
    """One line when the evaluation shows a poor result (drifted outputs or slower than fp32), else None."""
    if not evaluation:
        return None
    cosine = evaluation.get("mean_cosine")
    speedup = evaluation.get("speedup")
    drifted = cosine is not None and cosine < MIN_COSINE
    slower = speedup is not None and speedup < 1.0
    if not (drifted or slower):
        return None
    found = ([f"cosine {cosine:.3f} < {MIN_COSINE}"] if drifted else []) + (
        [f"{speedup:.2f}x fp32's speed"] if slower else []
    )
    return f"poor result ({', '.join(found)}): {_fixes(config, drifted)}"
