"""Export settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .._config import split_names
from ..errors import ConfigError, InputSpecError
from ..hierarchy.tree import DEFAULT_TORCH_NN_EXCEPTIONS

__all__ = ["ExportConfig", "InputSpec", "load_input_specs", "DEFAULT_TORCH_NN_EXCEPTIONS", "EXPORTERS"]

EXPORTERS = ("dynamo", "torchscript")
_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, example shape, dtype, dynamic axes and value range (integer inputs)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    dynamic_axes: dict[int, str] | None = None
    range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InputSpecError("every input spec needs a non-empty 'name'")
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError) as exc:
            raise InputSpecError(
                f"input {self.name!r}: 'shape' must be a list of integers, got {self.shape!r}"
            ) from exc
        if any(d < 0 for d in shape):
            raise InputSpecError(f"input {self.name!r}: shape dimensions must be >= 0, got {list(shape)}")
        object.__setattr__(self, "shape", shape)
        if self.dtype not in _DTYPES:
            raise InputSpecError(
                f"input {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(_DTYPES)}"
            )
        if self.dynamic_axes is not None:
            try:
                axes = {int(k): str(v) for k, v in dict(self.dynamic_axes).items()}
            except (TypeError, ValueError) as exc:
                raise InputSpecError(
                    f"input {self.name!r}: 'dynamic_axes' must map axis index to a name"
                ) from exc
            bad = [a for a in axes if not 0 <= a < len(shape)]
            if bad:
                raise InputSpecError(
                    f"input {self.name!r}: dynamic axes {bad} are outside its rank {len(shape)}"
                )
            object.__setattr__(self, "dynamic_axes", axes)
        if self.range is not None:
            lo, hi = (float(v) for v in self.range)
            if not lo < hi:
                raise InputSpecError(f"input {self.name!r}: 'range' must be [low, high] with low < high")
            object.__setattr__(self, "range", (lo, hi))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise InputSpecError(
                f"unknown keys in input spec: {sorted(unknown)}; valid: name, shape, dtype, dynamic_axes, range"
            )
        if "name" not in data or "shape" not in data:
            raise InputSpecError(f"input spec {data!r} needs at least 'name' and 'shape'")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "dynamic_axes": {str(k): v for k, v in (self.dynamic_axes or {}).items()},
            "range": list(self.range) if self.range else None,
        }


def load_input_specs(source: str | Path | dict[str, Any] | list[Any]) -> tuple[InputSpec, ...]:
    """Read ``{"inputs": [...]}`` from a JSON file, a dict, or a list of spec dicts."""
    data: Any = source
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InputSpecError(f"input specs file not found: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputSpecError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    if isinstance(data, dict):
        data = data.get("inputs")
    if not isinstance(data, list) or not data:
        raise InputSpecError(
            'input specs must be {"inputs": [{"name": ..., "shape": [...], "dtype": ...}, ...]}'
        )
    return tuple(s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in data)


@dataclass(frozen=True)
class ExportConfig:
    """Everything ``modelexport export`` can be told. Unknown or out-of-range values fail early."""

    exporter: str = "dynamo"
    opset: int | None = None
    static_shapes: bool = False
    input_specs: tuple[InputSpec, ...] | None = None
    input_shape: tuple[int, ...] | None = None
    text: str | None = None
    torch_nn_exceptions: tuple[str, ...] = DEFAULT_TORCH_NN_EXCEPTIONS
    include_torch_nn: bool = False
    validate: bool = True
    atol: float = 1e-4
    verify_topology: bool = False
    with_report: bool = False
    jit_graph: bool = False
    fx_graph: bool = False
    keep_batchnorm: bool = False
    keep_dropout: bool = False
    embed_metadata: bool = True
    task: str | None = None
    quantize: str | None = None
    #: Class labels for classifiers that have no transformers config (embedded in the metadata).
    id2label: dict[int, str] | None = None
    #: Pre-processing of a plain torch model, in transformers' processor-config form
    #: (e.g. {"image_processor_type": ..., "size": ..., "image_mean": ...}); embedded in the metadata.
    processor_config: dict[str, Any] | None = None
    #: Replace model files in the output folder that an earlier modelexport export did not write.
    overwrite: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        exporter = str(self.exporter).lower()
        if exporter not in EXPORTERS:
            raise ConfigError(f"exporter must be one of {', '.join(EXPORTERS)}, got {self.exporter!r}")
        object.__setattr__(self, "exporter", exporter)
        if self.opset is not None and not 7 <= int(self.opset) <= 23:
            raise ConfigError(f"opset must be between 7 and 23, got {self.opset}")
        if self.atol <= 0:
            raise ConfigError(f"atol must be > 0, got {self.atol}")
        if isinstance(self.torch_nn_exceptions, str):
            object.__setattr__(self, "torch_nn_exceptions", split_names(self.torch_nn_exceptions))
        if self.input_specs is not None and not isinstance(self.input_specs, tuple):
            object.__setattr__(self, "input_specs", load_input_specs(self.input_specs))
        if self.input_shape is not None:
            shape = tuple(int(d) for d in self.input_shape)
            if not shape or any(d <= 0 for d in shape):
                raise ConfigError(f"input_shape must be positive integers, got {self.input_shape!r}")
            object.__setattr__(self, "input_shape", shape)
        if self.id2label is not None:
            object.__setattr__(self, "id2label", {int(k): str(v) for k, v in dict(self.id2label).items()})
        if self.quantize not in (None, "none", "dynamic", "static"):
            raise ConfigError(f"quantize must be none, dynamic or static, got {self.quantize!r}")

    def with_changes(self, **changes: Any) -> ExportConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out["input_specs"] = [s.to_dict() for s in self.input_specs] if self.input_specs else None
        out["torch_nn_exceptions"] = list(self.torch_nn_exceptions)
        out["input_shape"] = list(self.input_shape) if self.input_shape else None
        return out
