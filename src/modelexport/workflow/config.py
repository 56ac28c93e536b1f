"""The pipeline's options, validated before any work starts, and what a run returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._config import split_names
from ..data import BUILTINS, Dataset
from ..errors import ConfigError
from ..onnxfile import DEFAULT_MODEL_FILE, output_path
from ..optimize.quantization import QUANT_MODES
from ..runtime.session import resolve_providers
from ..train.networks import NETWORKS, default_base_model
from ..train.policy_search import PolicySearchSpace
from ..train.weights import TrainConfig

__all__ = ["PipelineConfig", "PipelineResult", "LOG_LEVELS", "REPORT_NAME"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
REPORT_NAME = "pipeline_report.json"


@dataclass(frozen=True)
class PipelineConfig:
    """Every pipeline option; ``None`` means "the model type's default" (see ``NETWORKS[...].defaults``)."""

    model_type: str = "image_classifier"
    dataset_path: str = "sklearn:digits"
    output_model: str = "runs/pipeline"
    tta: bool | None = None
    tta_transforms: tuple[str, ...] = ()
    tta_aggregate: str | None = None
    ttt: bool | None = None
    ttt_iterations: int = 1
    quantize: str = "dynamic"
    ep: tuple[str, ...] = ("cpu",)
    batch_size: int | None = None
    learning_rate: float | None = None
    epochs: int | None = None
    log_level: str = "WARNING"
    base_model: str | None = None
    text_column: str | None = None
    label_column: str | None = None
    val_split: float = 0.2
    seed: int = 0
    iterations: int = 3
    latency_budget_ms: float | None = None
    optimize_policy: bool = True
    report: str | None = None
    progress: bool = True
    max_length: int = 128
    #: Replace existing files at ``output_model`` and ``report``: the file named and those an earlier run of ours
    #: recorded (never another file; the one output rule, :mod:`modelexport.onnxfile.output`).
    overwrite: bool = False

    def __post_init__(self) -> None:
        spec = NETWORKS.get(self.model_type)
        if spec is None:
            raise ConfigError(
                f"model_type must be one of {', '.join(sorted(NETWORKS))}, got {self.model_type!r}"
            )
        for name in ("epochs", "batch_size", "learning_rate", "tta", "ttt"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, spec.defaults.get(name))
        object.__setattr__(self, "tta_transforms", split_names(self.tta_transforms))
        object.__setattr__(self, "ep", split_names(self.ep) or ("cpu",))
        object.__setattr__(self, "quantize", str(self.quantize).lower())
        object.__setattr__(self, "log_level", str(self.log_level).upper())
        self._check_ranges()
        self._check_choices(spec.has_batchnorm)
        self._check_paths()

    def _check_ranges(self) -> None:
        TrainConfig(
            epochs=self.epochs, batch_size=self.batch_size, learning_rate=self.learning_rate, seed=self.seed
        )
        checks = [
            ("ttt_iterations", 1 <= self.ttt_iterations <= 100, "between 1 and 100"),
            ("val_split", 0.0 < self.val_split <= 0.5, "in (0, 0.5]"),
            ("iterations", 1 <= self.iterations <= 1000, "between 1 and 1000"),
            ("latency_budget_ms", self.latency_budget_ms is None or self.latency_budget_ms > 0, "> 0"),
            ("max_length", 8 <= self.max_length <= 4096, "between 8 and 4096"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"{name} must be {valid}, got {getattr(self, name)!r}")

    def _check_choices(self, has_batchnorm: bool) -> None:
        modes = ("none", *QUANT_MODES)
        if self.quantize not in modes:
            raise ConfigError(f"quantize must be one of {', '.join(modes)}, got {self.quantize!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        resolve_providers(list(self.ep))
        self.search_space()  # unknown TTA transforms / aggregates fail here
        if self.tta_transforms and not self.tta:
            raise ConfigError(
                "--tta_transforms given but --tta is false", hint="add --tta true or drop --tta_transforms"
            )
        if self.ttt and not has_batchnorm:
            raise ConfigError(
                f"--ttt true: BN adaptation needs BatchNorm layers and {self.model_type} has none",
                hint="use --ttt false (or --model_type image_classifier)",
            )

    def _check_paths(self) -> None:
        if self.dataset_path not in BUILTINS and not Path(self.dataset_path).exists():
            raise ConfigError(
                f"dataset not found: {self.dataset_path}",
                hint=f"pass an existing file or folder, or a built-in: {', '.join(sorted(BUILTINS))}",
            )
        base = self.base_model
        if (
            base
            and (base.startswith((".", "/", "~")) or Path(base).exists())
            and not Path(base).expanduser().is_dir()
        ):
            raise ConfigError(
                f"base model folder not found: {base}", hint="pass a local Hugging Face folder or a hub id"
            )
        if self.report and Path(self.report).is_dir():
            raise ConfigError(f"--report {self.report} is a folder; give a .json file path")

    # -- derived ------------------------------------------------------------------------------------

    @property
    def package_dir(self) -> Path:
        return self.model_file.parent

    @property
    def model_file(self) -> Path:
        """``--output_model``'s model file by the one output rule: ``NAME.onnx``, or ``model.onnx`` in a folder."""
        return output_path(self.output_model, DEFAULT_MODEL_FILE, bare_is_folder=True)[0]

    @property
    def quantized_file(self) -> Path | None:
        if self.quantize == "none":
            return None
        return self.model_file.with_name(f"{self.model_file.stem}_{self.quantize}.onnx")

    @property
    def report_file(self) -> Path:
        return Path(self.report) if self.report else self.package_dir / REPORT_NAME

    def report_inside(self) -> bool:
        """Whether the report is a file of the package (staged with it)."""
        return self.report_file.resolve().parent == self.package_dir.resolve()

    def search_space(self) -> PolicySearchSpace:
        return PolicySearchSpace(
            tta=bool(self.tta),
            tta_transforms=self.tta_transforms,
            tta_aggregate=self.tta_aggregate,
            ttt=bool(self.ttt),
            ttt_iterations=self.ttt_iterations,
            latency_budget_ms=self.latency_budget_ms,
            seed=self.seed,
        )

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            seed=self.seed,
            progress=self.progress,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tta_transforms"], out["ep"] = list(self.tta_transforms), list(self.ep)
        if self.model_type == "text_classifier":
            out["base_model"] = self.base_model or default_base_model()
        return out


@dataclass
class PipelineResult:
    """The report (fixed keys), the paths written and the live objects (the deployed DSPy program)."""

    config: PipelineConfig
    report: dict[str, Any]
    model_path: Path
    quantized_path: Path | None
    report_path: Path
    program: Any
    train: Dataset
    val: Dataset
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def deployed_path(self) -> Path:
        return self.quantized_path or self.model_path
