"""Export settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .._config import replace_checked, split_names
from .._io import MAX_JSON_BYTES, parse_json
from .._numeric import check_fits_in_memory, tensor_bytes
from ..errors import ConfigError, InputSpecError
from ..hierarchy.tree import DEFAULT_TORCH_NN_EXCEPTIONS
from ..metadata.tasks import normalize_task
from ..optimize.config import OptimizeConfig
from .loading import LIBRARIES

__all__ = [
    "ExportConfig",
    "InputSpec",
    "load_input_specs",
    "DEFAULT_TORCH_NN_EXCEPTIONS",
    "EXPORTERS",
    "EXPORT_DTYPES",
    "DEFAULT_ATOL",
]

EXPORTERS = ("dynamo", "torchscript")
#: What ``dtype=`` accepts -> the torch dtype name the model is cast to before capture.
EXPORT_DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
}
#: Parity tolerance per export dtype when ``atol`` is not given. fp16/bf16 keep 10 / 7 mantissa bits
#: (relative steps of ~1e-3 / ~8e-3), and the ONNX side rounds after every op where PyTorch fuses
#: (bf16 MiniLM: 0.31 on token states of magnitude 5.7); their bound scales with the output's magnitude
#: (see :class:`~.parity.ParityReport`).
DEFAULT_ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
#: Rank above which no real input goes (numpy's own limit is 64).
_MAX_RANK = 32
#: dtype -> bytes per element (the memory estimate before an example tensor is allocated).
_ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
_DTYPES = tuple(_ITEMSIZE)


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, example shape, dtype, dynamic axes and value range (integer inputs)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    dynamic_axes: dict[int, str] | None = None
    range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputSpecError(f"every input spec needs a non-empty string 'name', got {self.name!r}")
        shape = self.shape
        if (
            not isinstance(shape, list | tuple)
            or not all(_is_int(d) for d in shape)
            or len(shape) > _MAX_RANK
        ):
            raise InputSpecError(
                f"input {self.name!r}: 'shape' must be a list of at most {_MAX_RANK} integers, got {shape!r}"
            )
        if any(d < 1 for d in shape):
            raise InputSpecError(
                f"input {self.name!r}: shape dimensions must be >= 1 (the example input is run), got {list(shape)}"
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if not isinstance(self.dtype, str) or self.dtype not in _DTYPES:
            raise InputSpecError(
                f"input {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(_DTYPES)}"
            )
        check_fits_in_memory(
            tensor_bytes(self.shape, _ITEMSIZE[self.dtype]),
            f"input {self.name!r} of shape {list(shape)}",
            InputSpecError,
        )
        if self.dynamic_axes is not None:
            object.__setattr__(self, "dynamic_axes", self._axes())
        if self.range is not None:
            object.__setattr__(self, "range", self._range())

    def _axes(self) -> dict[int, str]:
        try:
            axes = {int(k): str(v) for k, v in dict(self.dynamic_axes).items()}  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise InputSpecError(
                f"input {self.name!r}: 'dynamic_axes' must map axis index to a name"
            ) from exc
        bad = [a for a in axes if not 0 <= a < len(self.shape)]
        if bad:
            raise InputSpecError(
                f"input {self.name!r}: dynamic axes {bad} are outside its rank {len(self.shape)}"
            )
        return axes

    def _range(self) -> tuple[float, float]:
        value = self.range
        if (
            not isinstance(value, list | tuple)
            or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or not all(math.isfinite(v) for v in value)
            or not value[0] < value[1]
        ):
            raise InputSpecError(
                f"input {self.name!r}: 'range' must be [low, high], two finite numbers with low < high, "
                f"got {value!r}"
            )
        return float(value[0]), float(value[1])

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


def _spec_text(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise InputSpecError(f"{path} is larger than {MAX_JSON_BYTES:,} bytes; not an input specs file")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputSpecError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputSpecError(f"cannot read {path}: {exc.strerror or exc}") from exc


def load_input_specs(source: str | Path | dict[str, Any] | list[Any]) -> tuple[InputSpec, ...]:
    """Read ``{"inputs": [...]}`` from a JSON file, a dict, or a list of spec dicts."""
    data: Any = source
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InputSpecError(f"input specs file not found: {path}")
        data = parse_json(_spec_text(path), str(path), InputSpecError)
    if isinstance(data, dict):
        data = data.get("inputs")
    if not isinstance(data, list) or not data or not all(isinstance(s, dict | InputSpec) for s in data):
        raise InputSpecError(
            'input specs must be {"inputs": [{"name": ..., "shape": [...], "dtype": ...}, ...]}'
        )
    specs = tuple(s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in data)
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputSpecError(
            f"input spec names must be unique: {', '.join(repr(n) for n in twice)} given more than once",
            hint="name each input once (the names become the ONNX graph's input names)",
        )
    return specs


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
    #: Max abs diff allowed in the parity check; None: :data:`DEFAULT_ATOL` for the export dtype.
    atol: float | None = None
    verify_topology: bool = False
    with_report: bool = False
    jit_graph: bool = False
    fx_graph: bool = False
    keep_batchnorm: bool = False
    keep_dropout: bool = False
    embed_metadata: bool = True
    task: str | None = None
    quantize: str | None = None
    #: Graph optimization level (O1-O4, ``modelexport optimize -O*``); the optimized file is deployed.
    optimize: str | None = None
    #: Class labels for classifiers that have no transformers config (embedded in the metadata).
    id2label: dict[int, str] | None = None
    #: Pre-processing of a plain torch model, in transformers' processor-config form
    #: (e.g. {"image_processor_type": ..., "size": ..., "image_mean": ...}); embedded in the metadata.
    processor_config: dict[str, Any] | None = None
    #: Replace the files an earlier run of ours wrote at the output (never another file; the one output rule,
    #: :mod:`modelexport.onnxfile.output`).
    overwrite: bool = False
    #: How to read a model folder (:data:`~.loading.LIBRARIES`): ``auto`` exports a sentence-transformers
    #: folder as its full embedding model (token_embeddings + sentence_embedding), as Optimum does.
    library: str = "auto"
    #: Cast the model's floating-point weights (and float inputs) to this dtype before capture.
    dtype: str = "float32"
    #: Where PyTorch runs the model for capture and the reference outputs: ``cpu``, ``cuda`` or ``cuda:N``.
    device: str = "cpu"

    def __post_init__(self) -> None:
        exporter = str(self.exporter).lower()
        if exporter not in EXPORTERS:
            raise ConfigError(f"exporter must be one of {', '.join(EXPORTERS)}, got {self.exporter!r}")
        object.__setattr__(self, "exporter", exporter)
        if self.opset is not None and not 7 <= int(self.opset) <= 23:
            raise ConfigError(f"opset must be between 7 and 23, got {self.opset}")
        if self.atol is not None and not self.atol > 0:
            raise ConfigError(f"atol must be > 0, got {self.atol}")
        dtype = EXPORT_DTYPES.get(str(self.dtype).lower())
        if dtype is None:
            raise ConfigError(f"dtype must be one of fp32, fp16, bf16, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if not _DEVICE.match(str(self.device).lower()):
            raise ConfigError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        object.__setattr__(self, "device", str(self.device).lower())
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
        if self.library not in LIBRARIES:
            raise ConfigError(f"library must be one of {', '.join(LIBRARIES)}, got {self.library!r}")
        if self.quantize not in (None, "none", "dynamic", "static"):
            raise ConfigError(f"quantize must be none, dynamic or static, got {self.quantize!r}")
        if self.optimize not in (None, "none"):
            object.__setattr__(self, "optimize", OptimizeConfig.preset(self.optimize).preset_name)
        if self.task is not None:
            normalize_task(self.task)  # a mistyped task fails here, before the model loads

    @property
    def tolerance(self) -> float:
        """The parity tolerance: ``atol``, else the export dtype's default."""
        return self.atol if self.atol is not None else DEFAULT_ATOL[self.dtype]

    def with_changes(self, **changes: object) -> ExportConfig:
        return replace_checked(self, "export", changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["input_specs"] = [s.to_dict() for s in self.input_specs] if self.input_specs else None
        out["torch_nn_exceptions"] = list(self.torch_nn_exceptions)
        out["input_shape"] = list(self.input_shape) if self.input_shape else None
        return out
