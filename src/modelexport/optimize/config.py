"""Settings for ``quantize`` and ``optimize``: frozen dataclasses validated on creation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .._config import split_names
from ..errors import ConfigError

__all__ = ["QuantizeConfig", "OptimizeConfig", "WEIGHT_TYPES", "CALIBRATE_METHODS", "GRAPH_LEVELS"]

WEIGHT_TYPES = ("int8", "uint8")
CALIBRATE_METHODS = ("minmax", "entropy", "percentile")
GRAPH_LEVELS = ("none", "basic", "extended", "all")


def _choice(name: str, value: str, valid: tuple[str, ...]) -> str:
    v = str(value).lower()
    if v not in valid:
        raise ConfigError(f"{name} must be one of {', '.join(valid)}, got {value!r}")
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

    def __post_init__(self) -> None:
        from .quantization import QUANT_MODES

        object.__setattr__(self, "mode", _choice("mode", self.mode, tuple(QUANT_MODES)))
        object.__setattr__(self, "weight_type", _choice("weight_type", self.weight_type, WEIGHT_TYPES))
        object.__setattr__(
            self, "activation_type", _choice("activation_type", self.activation_type, WEIGHT_TYPES)
        )
        object.__setattr__(
            self, "calibrate_method", _choice("calibrate_method", self.calibrate_method, CALIBRATE_METHODS)
        )
        object.__setattr__(self, "op_types", split_names(self.op_types))
        object.__setattr__(self, "exclude_modules", split_names(self.exclude_modules))
        if self.calibration_samples < 1:
            raise ConfigError(f"calibration_samples must be >= 1, got {self.calibration_samples}")

    def with_changes(self, **changes: Any) -> QuantizeConfig:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown quantize option(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

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


@dataclass(frozen=True)
class OptimizeConfig:
    """Which graph passes to run, in this order: ORT level, transformer fusion, fp16, simplify."""

    level: str = "extended"
    transformer_fusion: bool = False
    model_type: str | None = None  # ORT fusion family; None: from the embedded config
    num_heads: int | None = None
    hidden_size: int | None = None
    fp16: bool = False
    simplify: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", _choice("level", self.level, GRAPH_LEVELS))
        for name in ("num_heads", "hidden_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.level == "none" and not (self.transformer_fusion or self.fp16 or self.simplify):
            raise ConfigError("nothing to do: level none and no --transformer-fusion/--fp16/--simplify")

    def record(self) -> dict[str, Any]:
        return asdict(self)
