"""Settings for ``quantize`` and ``optimize``: frozen dataclasses validated on creation, the registries
they validate against, and named presets built from those registries.

``QUANT_MODES`` is filled by :mod:`.quantization` (``@register_mode``); importing any module of this
package runs the package ``__init__``, which imports it, so the registry is complete before a config
is validated. Presets follow Optimum: ``QuantizeConfig.preset("avx512_vnni")`` (cf.
``AutoQuantizationConfig``) and ``OptimizeConfig.preset("O2")`` (cf. ``AutoOptimizationConfig``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from .._config import closest, split_names
from ..errors import ConfigError
from ..inference.feeds import SampleSet
from ..runtime.session import graph_level

__all__ = [
    "MAX_SAMPLES",
    "check_samples",
    "CALIBRATE_METHODS",
    "FUSION_ENGINES",
    "OPTIMIZE_PRESETS",
    "QUANTIZE_PRESETS",
    "QUANT_MODES",
    "WEIGHT_TYPES",
    "OptimizeConfig",
    "QuantizeConfig",
    "register_mode",
]

#: Integer types of weights/activations: our name -> ``onnxruntime.quantization.QuantType`` member.
WEIGHT_TYPES = {"int8": "QInt8", "uint8": "QUInt8"}
#: Activation range calibrators: our name -> ``onnxruntime.quantization.CalibrationMethod`` member.
CALIBRATE_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}

#: Who fuses transformer patterns (``transformer_fusion``): ``auto`` = onnxscript's rewriter (made for
#: dynamo graphs), then ORT's transformer optimizer only where it adds something (approximate Gelu, or
#: onnxscript matched nothing: TorchScript graphs); ``onnxscript`` / ``ort``: that library alone
#: (``onnxscript`` still asks ORT for FastGelu when ``approximate_gelu``).
FUSION_ENGINES = ("auto", "onnxscript", "ort")

#: ``fn(in_path, out_path, config, nodes_to_exclude, samples)`` writes the quantized model (files:
#: ORT's quantizers mishandle in-memory protos with large initializers).
ModeFn = Callable[[Path, Path, "QuantizeConfig", list[str], "SampleSet | None"], None]
#: Quantization modes (dynamic, static), filled by :mod:`.quantization`.
QUANT_MODES: dict[str, ModeFn] = {}


def register_mode(name: str) -> Callable[[ModeFn], ModeFn]:
    """Add a quantization mode to ``QUANT_MODES``."""

    def deco(fn: ModeFn) -> ModeFn:
        QUANT_MODES[name] = fn
        return fn

    return deco


#: Hardware targets (Optimum's ``AutoQuantizationConfig``): integer types, per-channel, reduce_range.
#: The mode comes from the call (``preset("arm64", mode="static")``), dynamic by default; each
#: mode of ``QUANT_MODES`` is a preset too.
QUANTIZE_PRESETS: dict[str, dict[str, Any]] = {
    "arm64": dict(weight_type="int8", activation_type="uint8", per_channel=True),
    "avx2": dict(weight_type="uint8", activation_type="uint8", per_channel=True),
    "avx512": dict(weight_type="int8", activation_type="uint8", per_channel=True),
    "avx512_vnni": dict(weight_type="int8", activation_type="uint8", per_channel=True),
    "tensorrt": dict(mode="static", weight_type="int8", activation_type="int8", per_channel=True),
}


#: More samples than any calibration or comparison needs; the bound keeps a typo from running for days.
MAX_SAMPLES = 1_000_000


def check_samples(name: str, value: int) -> None:
    """The one range check of a sample count (calibration, evaluation): 1..MAX_SAMPLES."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SAMPLES:
        raise ConfigError(f"{name} must be an integer in [1, {MAX_SAMPLES:,}], got {value!r}")


def _choice(name: str, value: str, valid: Any) -> str:
    v = str(value).lower()
    if v not in valid:
        guess = closest(value, valid)
        mean = f" (did you mean {guess!r}?)" if guess else ""
        raise ConfigError(f"{name} must be one of {', '.join(valid)}, got {value!r}{mean}")
    return v


def _with_changes(cfg: Any, what: str, changes: dict[str, Any]) -> Any:
    unknown = set(changes) - {f.name for f in fields(cfg)}
    if unknown:
        raise ConfigError(f"unknown {what} option(s): {', '.join(sorted(unknown))}")
    return replace(cfg, **changes)


@dataclass(frozen=True)
class QuantizeConfig:
    """How to quantize. ``mode`` names an entry of ``QUANT_MODES`` (dynamic, static)."""

    mode: str = "dynamic"
    per_channel: bool = False
    reduce_range: bool = False
    weight_type: str = "int8"
    activation_type: str = "int8"
    op_types: tuple[str, ...] = ()
    exclude_modules: tuple[str, ...] = ()
    calibration_data: str | None = None
    calibration_samples: int = 100
    calibrate_method: str = "minmax"
    tokenizer: str | None = None
    preprocess: bool = True
    progress: bool = True
    seed: int = 0
    preset_name: str | None = None  # the preset this config started from (recorded)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _choice("mode", self.mode, QUANT_MODES))
        object.__setattr__(self, "weight_type", _choice("weight_type", self.weight_type, WEIGHT_TYPES))
        object.__setattr__(
            self, "activation_type", _choice("activation_type", self.activation_type, WEIGHT_TYPES)
        )
        object.__setattr__(
            self, "calibrate_method", _choice("calibrate_method", self.calibrate_method, CALIBRATE_METHODS)
        )
        object.__setattr__(self, "op_types", split_names(self.op_types))
        object.__setattr__(self, "exclude_modules", split_names(self.exclude_modules))
        if self.preset_name is not None:
            object.__setattr__(self, "preset_name", _choice("preset", self.preset_name, self.preset_names()))
        check_samples("calibration_samples", self.calibration_samples)

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        return (*QUANT_MODES, *QUANTIZE_PRESETS)

    @classmethod
    def preset(cls, name: str, **changes: Any) -> QuantizeConfig:
        """A named preset (a mode of ``QUANT_MODES`` or a target of ``QUANTIZE_PRESETS``) with ``changes``."""
        key = _choice("quantize preset", name, cls.preset_names())
        base = {"mode": key} if key in QUANT_MODES else QUANTIZE_PRESETS[key]
        return _with_changes(cls(), "quantize", {**base, **changes, "preset_name": key})

    def with_changes(self, **changes: Any) -> QuantizeConfig:
        return _with_changes(self, "quantize", changes)

    def record(self) -> dict[str, Any]:
        """What is written into ``modelexport.quantization`` (settings that shaped the weights)."""
        data = asdict(self)
        for key in ("progress", "preprocess", "tokenizer"):
            data.pop(key)
        if self.mode != "static":
            for key in ("calibration_data", "calibration_samples", "calibrate_method", "activation_type"):
                data.pop(key)
        data["op_types"], data["exclude_modules"] = list(self.op_types), list(self.exclude_modules)
        return data


def _check_fusion_model_type(name: str) -> None:
    """``name`` must be one of ONNX Runtime's transformer-optimizer families (its own ``MODEL_TYPES``)."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    if name not in MODEL_TYPES:
        raise ConfigError(
            f"model_type must be one of ONNX Runtime's fusion families ({', '.join(sorted(MODEL_TYPES))}),"
            f" got {name[:80]!r}"
        )


@dataclass(frozen=True)
class OptimizeConfig:
    """Which graph passes to run, in this order: transformer fusion, ORT level, fp16, simplify."""

    level: str = "extended"
    transformer_fusion: bool = False
    fusion_engine: str = "auto"  # FUSION_ENGINES
    approximate_gelu: bool = False  # transformer fusion option: Gelu -> FastGelu (tanh approximation)
    #: Keep the fused skip normalizations (GPU kernels); off: split into Add + normalization, faster on CPU
    skip_norm_fusion: bool = False
    model_type: str | None = None  # ORT fusion family; None: from the embedded config
    num_heads: int | None = None
    hidden_size: int | None = None
    fp16: bool = False
    simplify: bool = False
    preset_name: str | None = None  # the O-level this config started from (recorded)

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", graph_level(self.level, "level"))
        object.__setattr__(
            self, "fusion_engine", _choice("fusion_engine", self.fusion_engine, FUSION_ENGINES)
        )
        for name in ("num_heads", "hidden_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.model_type is not None:
            _check_fusion_model_type(self.model_type)
        if self.approximate_gelu and not self.transformer_fusion:
            raise ConfigError(
                "approximate_gelu is a transformer fusion option",
                hint="add --transformer-fusion (or use -O3)",
            )
        if self.preset_name is not None:
            object.__setattr__(self, "preset_name", _level_name(self.preset_name))
        if self.level == "disable" and not (self.transformer_fusion or self.fp16 or self.simplify):
            raise ConfigError("nothing to do: level disable and no --transformer-fusion/--fp16/--simplify")

    @classmethod
    def preset(cls, name: str, **changes: Any) -> OptimizeConfig:
        """An optimization level of ``OPTIMIZE_PRESETS`` (O1-O4) with ``changes``."""
        key = _level_name(name)
        return _with_changes(OPTIMIZE_PRESETS[key], "optimize", {**changes, "preset_name": key})

    def with_changes(self, **changes: Any) -> OptimizeConfig:
        return _with_changes(self, "optimize", changes)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _level_name(name: str) -> str:
    key = str(name).upper()
    if key not in OPTIMIZE_PRESETS:
        raise ConfigError(f"optimization preset must be one of {', '.join(OPTIMIZE_PRESETS)}, got {name!r}")
    return key


def _levels() -> dict[str, OptimizeConfig]:
    """O1-O4 as in Optimum's ``AutoOptimizationConfig``; each level adds one step to the one before.

    Levels are names of ``runtime.session.GRAPH_LEVELS``, the rest are flags of ``GRAPH_PASSES``; each
    preset is a validated :class:`OptimizeConfig`, so a bad entry fails at import.
    """
    steps = {
        "O1": dict(level="basic"),  # basic graph optimizations
        "O2": dict(level="extended", transformer_fusion=True),  # + extended and transformer fusions
        "O3": dict(approximate_gelu=True),  # + approximate Gelu
        "O4": dict(fp16=True, skip_norm_fusion=True),  # + float16 (GPU deployment, fused skip norms)
    }
    levels: dict[str, OptimizeConfig] = {}
    current: dict[str, Any] = {}
    for name, step in steps.items():
        current = {**current, **step}
        levels[name] = OptimizeConfig(**current)
    return levels


#: Optimization levels: name -> config (``OptimizeConfig.preset("O2")``).
OPTIMIZE_PRESETS: dict[str, OptimizeConfig] = _levels()
