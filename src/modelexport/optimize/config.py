"""Settings for ``quantize`` and ``optimize``: frozen dataclasses validated on creation, the registries
they validate against, and named presets built from those registries.

``QUANT_MODES`` is filled by :mod:`.quantization` (``@QUANT_MODES.register``) and ``WEIGHT_ALGORITHMS`` by
:mod:`.weight_only` (``@register_weight_algorithm``); importing any module of this package runs the
package ``__init__``, which imports both, so the registries are complete before a config is validated. Presets follow Optimum: ``QuantizeConfig.preset("avx512_vnni")`` (cf.
``AutoQuantizationConfig``) and ``OptimizeConfig.preset("O2")`` (cf. ``AutoOptimizationConfig``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._config import closest, replace_checked, split_names
from .._registry import Registry
from ..errors import ConfigError
from ..inference.feeds import SampleSet
from ..runtime.session import graph_level

if TYPE_CHECKING:
    import onnx

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
    "ACCURACY_LEVELS",
    "BLOCK_SIZES",
    "MIXED_PRECISION",
    "WEIGHT_ALGORITHMS",
    "WEIGHT_BITS",
    "WEIGHT_PRESETS",
    "WeightAlgorithm",
    "WeightOnlyConfig",
    "register_weight_algorithm",
    "quantize_config",
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
QUANT_MODES: Registry[ModeFn] = Registry("quantization mode")


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


def _choice(name: str, value: str, valid: Collection[str]) -> str:
    v = str(value).lower()
    if v not in valid:
        guess = closest(value, valid)
        mean = f" (did you mean {guess!r}?)" if guess else ""
        raise ConfigError(f"{name} must be one of {', '.join(valid)}, got {value!r}{mean}")
    return v


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
    def preset(cls, name: str, **changes: object) -> QuantizeConfig:
        """A named preset (a mode of ``QUANT_MODES`` or a target of ``QUANTIZE_PRESETS``) with ``changes``."""
        key = _choice("quantize preset", name, cls.preset_names())
        base = {"mode": key} if key in QUANT_MODES else QUANTIZE_PRESETS[key]
        return replace_checked(cls(), "quantize", {**base, **changes, "preset_name": key})

    def with_changes(self, **changes: object) -> QuantizeConfig:
        return replace_checked(self, "quantize", changes)

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


#: Weight-only quantization (``quantize --weights``): our name -> bits per weight of ``MatMulNBits``.
WEIGHT_BITS = {"int4": 4, "int8": 8}
#: ``MatMulNBits``' ``accuracy_level``: the type its activations are computed in (0 leaves it to ONNX Runtime:
#: fp32 on the CPU). 4 quantizes each block of activations to int8 on the fly, the fast path on CPUs.
ACCURACY_LEVELS = {0: "unset", 1: "fp32", 2: "fp16", 3: "bf16", 4: "int8"}
#: Which int4 weights stay int8 (``mixed_precision``). Measured on all-MiniLM-L6-v2 (README): int4 everywhere
#: keeps a sentence-embedding cosine of 0.965 to fp32, the projections that read a normalization's output at
#: int8 0.99; a generating model's per-token time is its weights' bytes, so ``auto`` keeps those int4.
MIXED_PRECISION = {
    "auto": "norm_inputs for models that do not generate text, none for those that do",
    "none": "every quantized weight at the --weights width (onnxruntime-genai's int4 format)",
    "norm_inputs": "MatMuls that read a normalization's output (attention q/k/v, MLP up/gate) at int8",
}
#: Block sizes ONNX Runtime's ``MatMulNBits`` kernels take: weights along K, one scale per block and column.
BLOCK_SIZES = (16, 32, 64, 128, 256)

#: ``fn(model, config, nodes_to_quantize, samples)`` -> the model with those MatMuls as ``MatMulNBits``
#: (and, when asked, embeddings as ``GatherBlockQuantized``); the input is left untouched.
WeightFn = Callable[["onnx.ModelProto", "WeightOnlyConfig", list[str], "SampleSet | None"], "onnx.ModelProto"]


@dataclass(frozen=True)
class WeightAlgorithm:
    """A weight-only algorithm of ``WEIGHT_ALGORITHMS`` and what it supports (checked before any work)."""

    name: str
    fn: WeightFn
    bits: tuple[int, ...]
    symmetric: tuple[bool, ...]  # the first is its default
    calibrated: bool
    embeddings: bool  # whether it can quantize a Gather's table
    summary: str


#: Weight-only algorithms (rtn, hqq, gptq), filled by :mod:`.weight_only`.
WEIGHT_ALGORITHMS: Registry[WeightAlgorithm] = Registry("weight-only algorithm")


def register_weight_algorithm(
    name: str,
    *,
    bits: tuple[int, ...],
    symmetric: tuple[bool, ...],
    calibrated: bool = False,
    embeddings: bool = False,
    summary: str = "",
) -> Callable[[WeightFn], WeightFn]:
    """Add a weight-only algorithm to ``WEIGHT_ALGORITHMS``."""
    return WEIGHT_ALGORITHMS.register_as(
        name, lambda fn: WeightAlgorithm(name, fn, bits, symmetric, calibrated, embeddings, summary)
    )


def _block_size(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in BLOCK_SIZES:
        raise ConfigError(
            f"block_size must be a power of two from 16 to 256 ({', '.join(map(str, BLOCK_SIZES))}), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class WeightOnlyConfig:
    """Weight-only quantization to ONNX Runtime's ``MatMulNBits`` (``quantize --weights int4|int8``).

    Weights become ``bits``-bit integers in blocks of ``block_size`` along the input dimension (one scale,
    and without ``symmetric`` one zero point, per block and output column); activations stay float and are
    computed in the type ``accuracy_level`` names. ``algorithm`` names an entry of ``WEIGHT_ALGORITHMS``;
    ``mixed_precision`` keeps the most sensitive int4 weights at int8 (``MIXED_PRECISION``; those are always
    round-to-nearest).
    The LM head (the MatMul that writes ``logits``) is quantized unless ``quantize_lm_head`` is off, token
    embeddings only with ``quantize_embeddings``; ``fuse_projections`` first joins MatMuls that read the
    same input (an attention's q/k/v, an MLP's gate/up) into one, so a decoding step runs fewer kernels.
    """

    weights: str = "int4"
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool | None = None  # None: the algorithm's default (rtn, gptq: symmetric; hqq: asymmetric)
    algorithm: str = "rtn"
    mixed_precision: str = "auto"  # MIXED_PRECISION
    quantize_lm_head: bool = True
    quantize_embeddings: bool = False
    fuse_projections: bool = True
    exclude_modules: tuple[str, ...] = ()
    calibration_data: str | None = None
    calibration_samples: int = 32
    tokenizer: str | None = None
    progress: bool = True
    seed: int = 0
    preset_name: str | None = None  # the preset this config started from (recorded)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _choice("weights", self.weights, WEIGHT_BITS))
        object.__setattr__(self, "algorithm", _choice("algorithm", self.algorithm, WEIGHT_ALGORITHMS))
        object.__setattr__(
            self, "mixed_precision", _choice("mixed_precision", self.mixed_precision, MIXED_PRECISION)
        )
        if self.weights == "int8" and self.mixed_precision == "norm_inputs":
            raise ConfigError(
                "mixed_precision norm_inputs keeps some int4 weights at int8; with int8 weights every one already is",
                hint="leave --mixed-precision out, or use --weights int4",
            )
        _block_size(self.block_size)
        if self.accuracy_level not in ACCURACY_LEVELS or isinstance(self.accuracy_level, bool):
            levels = ", ".join(f"{k} ({v})" for k, v in ACCURACY_LEVELS.items())
            raise ConfigError(f"accuracy_level must be one of {levels}, got {self.accuracy_level!r}")
        algo = WEIGHT_ALGORITHMS[self.algorithm]
        if self.bits not in algo.bits:
            raise ConfigError(
                f"algorithm {self.algorithm} quantizes weights to {' or '.join(f'int{b}' for b in algo.bits)}, "
                f"not {self.weights}",
                hint="use --algorithm rtn for int8 weights",
            )
        if self.symmetric is None:
            object.__setattr__(self, "symmetric", algo.symmetric[0])
        elif self.symmetric not in algo.symmetric:
            kind = "symmetric" if self.symmetric else "asymmetric"
            raise ConfigError(f"algorithm {self.algorithm} has no {kind} form", hint="leave --symmetric out")
        if self.quantize_embeddings and not algo.embeddings:
            raise ConfigError(
                f"algorithm {self.algorithm} cannot quantize embeddings (ONNX Runtime's GatherBlockQuantized "
                "takes integer zero points only)",
                hint="use --algorithm rtn with --quantize-embeddings, or leave it out",
            )
        if self.quantize_embeddings and self.bits != 4:
            raise ConfigError(
                f"embeddings are quantized to int4 only (ONNX Runtime's GatherBlockQuantized), not {self.weights}",
                hint="leave --quantize-embeddings out, or use --weights int4",
            )
        if self.calibration_data is not None and not algo.calibrated:
            calibrated = [n for n, a in WEIGHT_ALGORITHMS.items() if a.calibrated]
            raise ConfigError(
                f"algorithm {self.algorithm} needs no calibration data",
                hint=f"leave --calibration-data out, or use --algorithm {' or '.join(calibrated)}",
            )
        object.__setattr__(self, "exclude_modules", split_names(self.exclude_modules))
        if self.preset_name is not None:
            object.__setattr__(self, "preset_name", _choice("preset", self.preset_name, WEIGHT_PRESETS))
        check_samples("calibration_samples", self.calibration_samples)

    @property
    def bits(self) -> int:
        return WEIGHT_BITS[self.weights]

    @property
    def mode(self) -> str:
        """How summaries name this quantization (``weights_int4``)."""
        return f"weights_{self.weights}"

    @property
    def calibrated(self) -> bool:
        return WEIGHT_ALGORITHMS[self.algorithm].calibrated

    @classmethod
    def preset(cls, name: str, **changes: object) -> WeightOnlyConfig:
        """A named preset of ``WEIGHT_PRESETS`` with ``changes``."""
        key = _choice("weight-only preset", name, WEIGHT_PRESETS)
        return cls().with_changes(**{**WEIGHT_PRESETS[key], **changes, "preset_name": key})

    def with_changes(self, **changes: object) -> WeightOnlyConfig:
        """A copy with ``changes``; another algorithm without ``symmetric`` takes that algorithm's default."""
        if "algorithm" in changes and "symmetric" not in changes:
            changes = {**changes, "symmetric": None}
        return replace_checked(self, "weight-only", changes)

    def record(self) -> dict[str, Any]:
        """What is written into ``modelexport.quantization`` (settings that shaped the weights)."""
        data = asdict(self)
        for key in ("progress", "tokenizer"):
            data.pop(key)
        if not self.calibrated:
            for key in ("calibration_data", "calibration_samples", "seed"):
                data.pop(key)
        data["mode"], data["bits"] = "weight_only", self.bits
        data["exclude_modules"] = list(self.exclude_modules)
        return data


#: Weight-only presets: ``int4`` is onnxruntime-genai's CPU format (RTN, block 32, symmetric, int8
#: compute, LM head in int4, embeddings float); ``int8`` the same with 8-bit weights; ``int4_hqq`` the
#: data-free HQQ optimizer (asymmetric, float zero points); ``int4_gptq`` calibrates on data.
WEIGHT_PRESETS: dict[str, dict[str, Any]] = {
    "int4": {},
    "int8": dict(weights="int8"),
    "int4_hqq": dict(algorithm="hqq"),
    "int4_gptq": dict(algorithm="gptq"),
}


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
    #: Keep the fused skip normalizations (GPU kernels); off: split into Add + normalization, faster on CPU (a
    #: graph with a key/value cache keeps the RMS form, faster on its one-token steps: ``skip_norm.kept_for``)
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
    def preset(cls, name: str, **changes: object) -> OptimizeConfig:
        """An optimization level of ``OPTIMIZE_PRESETS`` (O1-O4) with ``changes``."""
        key = _level_name(name)
        return replace_checked(OPTIMIZE_PRESETS[key], "optimize", {**changes, "preset_name": key})

    def with_changes(self, **changes: object) -> OptimizeConfig:
        return replace_checked(self, "optimize", changes)

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


def _flags(names: list[str]) -> str:
    return ", ".join(f"--{n.replace('_', '-')}" for n in names)


def quantize_config(preset: str | None = None, **options: object) -> QuantizeConfig | WeightOnlyConfig:
    """The config a ``quantize`` call means, from the options it was given (``None`` values are not given).

    Weight-only (:class:`WeightOnlyConfig`) when ``weights`` is given or ``preset`` names one of
    ``WEIGHT_PRESETS``; int8 (:class:`QuantizeConfig`) otherwise. An option of the other kind is an error
    that names it, before any work.
    """
    given = {k: v for k, v in options.items() if v is not None}
    if given.get("weights") is not None or preset in WEIGHT_PRESETS:
        wrong = sorted(set(given) - {f.name for f in fields(WeightOnlyConfig)})
        if wrong:
            raise ConfigError(
                f"{_flags(wrong)}: int8 quantization options (--mode dynamic|static), not weight-only (--weights)",
                hint="leave them out; weight-only takes --block-size, --accuracy-level, --symmetric/--asymmetric, "
                "--algorithm, --quantize-lm-head, --quantize-embeddings",
            )
        base = WeightOnlyConfig.preset(preset) if preset else WeightOnlyConfig()
        return base.with_changes(**given)
    wrong = sorted(set(given) - {f.name for f in fields(QuantizeConfig)})
    if wrong:
        raise ConfigError(
            f"{_flags(wrong)}: options of weight-only quantization", hint="add --weights int4 (or int8)"
        )
    return (QuantizeConfig.preset(preset) if preset else QuantizeConfig()).with_changes(**given)
