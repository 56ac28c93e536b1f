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
from ..testtime.augment import MODALITIES, resolve_transform, transform_names
from ..train.networks import NETWORKS, default_base_model
from ..train.policy_search import PolicySearchSpace
from ..train.settings import DEFAULT_MC_PASSES, ENSEMBLES, FALSE_WORDS, TRUE_WORDS, TTT_METHODS
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
    #: Test-time settings: ``None`` (or ``()``) leaves the setting to the policy search (with
    #: ``optimize_policy=False``, to the model type's default); a value is what runs.
    tta: bool | None = None
    tta_transforms: tuple[str, ...] = ()
    tta_aggregate: str | None = None
    #: True / False, or the method: bn, tent, sar (True: bn).
    ttt: bool | str | None = None
    #: BN: passes of batch statistics (1: the robust memory statistics); tent / sar: gradient steps per batch.
    ttt_iterations: int | None = None
    #: MC-dropout passes (0: off).
    mc_dropout: int | None = None
    #: ``int8``: the deployed model averaged with its int8 twin (fp32 + int8); ``none``: the model alone.
    ensemble: str | None = None
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
    #: Image models: record a few training images per class with the model (``modelexport.source_anchors``),
    #: against which test-time adaptation measures a noisy stream, where its validation images gain from them;
    #: False: none (they are training data, and the package carries them).
    anchors: bool = True
    report: str | None = None
    progress: bool = True
    max_length: int = 128
    #: Replace existing files at ``output_model`` and ``report``: the file named and those an earlier run of ours
    #: recorded (never another file; the one output rule, :mod:`modelexport.onnxfile.output`).
    overwrite: bool = False
    #: Set from ``ttt`` (``--ttt tent``); bn when ``ttt`` is a boolean.
    ttt_method: str = "bn"
    #: The test-time settings the caller gave (derived; the report says which the search chose).
    user_set: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        spec = NETWORKS.find(self.model_type)
        if spec is None:
            raise ConfigError(
                f"model_type must be one of {', '.join(sorted(NETWORKS))}, got {self.model_type!r}"
            )
        object.__setattr__(self, "user_set", self._given())
        for name in ("epochs", "batch_size", "learning_rate"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, spec.defaults.get(name))
        self._ttt_method()
        object.__setattr__(self, "tta_transforms", split_names(self.tta_transforms))
        if self.tta_transforms and self.tta is None:
            object.__setattr__(self, "tta", True)  # transforms given: TTA is what the user asked for
        if not self.optimize_policy:  # nothing is searched: what is left open takes the model type's default
            for name in ("tta", "ttt"):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, spec.defaults.get(name))
        object.__setattr__(self, "ep", split_names(self.ep) or ("cpu",))
        object.__setattr__(self, "quantize", str(self.quantize).lower())
        object.__setattr__(self, "log_level", str(self.log_level).upper())
        self._check_ranges()
        self._check_choices(spec.has_batchnorm)
        self._check_paths()

    def _given(self) -> tuple[str, ...]:
        """The test-time settings the caller set (the search leaves them as they are)."""
        given = {
            "tta": self.tta is not None or bool(split_names(self.tta_transforms)),
            "tta_transforms": bool(split_names(self.tta_transforms)),
            "tta_aggregate": self.tta_aggregate is not None,
            "ttt": self.ttt is not None,
            "ttt_iterations": self.ttt_iterations is not None,
            "learning_rate": self.learning_rate is not None,
            "mc_dropout": self.mc_dropout is not None,
            "ensemble": self.ensemble is not None,
        }
        return tuple(k for k, v in given.items() if v)

    def _ttt_method(self) -> None:
        """``ttt``: a boolean, or a method name (bn, tent, sar), into ``ttt`` and ``ttt_method``."""
        value = self.ttt
        if isinstance(value, str):
            word = value.strip().lower()
            if word in TRUE_WORDS | FALSE_WORDS:
                value = word in TRUE_WORDS
            elif word in TTT_METHODS:
                object.__setattr__(self, "ttt_method", word)
                value = True
            else:
                raise ConfigError(
                    f"--ttt must be true, false or a method ({', '.join(TTT_METHODS)}), got {self.ttt!r}"
                )
        object.__setattr__(self, "ttt", value)

    def _check_ranges(self) -> None:
        TrainConfig(
            epochs=self.epochs, batch_size=self.batch_size, learning_rate=self.learning_rate, seed=self.seed
        )
        checks = [
            (
                "ttt_iterations",
                self.ttt_iterations is None or 1 <= self.ttt_iterations <= 100,
                "between 1 and 100",
            ),
            (
                "mc_dropout",
                self.mc_dropout is None or self.mc_dropout == 0 or 2 <= self.mc_dropout <= 256,
                "0 (off) or between 2 and 256 passes",
            ),
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
        if self.ensemble is not None and self.ensemble not in ENSEMBLES:
            raise ConfigError(f"--ensemble must be one of {', '.join(ENSEMBLES)}, got {self.ensemble!r}")
        if self.ensemble == "int8" and self.quantize == "none":
            raise ConfigError(
                "--ensemble int8 averages the model with its int8 twin, and --quantize none makes none",
                hint="add --quantize dynamic (or static), or drop --ensemble",
            )
        if self.ttt and self.ttt_method != "bn" and self.quantize != "none":
            raise ConfigError(
                f"--ttt {self.ttt_method} takes gradient steps through the model, and the deployed int8 model "
                f"(--quantize {self.quantize}) has integer operators without gradients",
                hint="add --quantize none, or use --ttt bn (statistics only, works on int8)",
            )
        if self.mc_dropout and self.quantize != "none":
            raise ConfigError(
                f"--mc_dropout {self.mc_dropout} samples the model's Dropout nodes, and the int8 model "
                f"(--quantize {self.quantize}) has none: quantization's graph optimization removes them",
                hint="add --quantize none, or drop --mc_dropout",
            )
        self._check_transforms()
        self.search_space()  # unknown aggregates fail here
        if self.tta_transforms and self.tta is False:
            raise ConfigError(
                "--tta_transforms given but --tta is false", hint="add --tta true or drop --tta_transforms"
            )
        if self.ttt and not has_batchnorm:
            raise ConfigError(
                f"--ttt {self.ttt_method if self.ttt_method != 'bn' else 'true'}: test-time training adapts "
                f"BatchNorm layers and {self.model_type} has none",
                hint="use --ttt false (or --model_type image_classifier)",
            )

    def _check_transforms(self) -> None:
        """Every TTA transform named means something for this model type's inputs (``flip`` and ``rotate``
        are the image transforms hflip and rot90; on text they mean nothing): checked before any training."""
        modality = NETWORKS[self.model_type].kind
        wrong = [n for n in self.tta_transforms if resolve_transform(n, modality) is None]
        if wrong:
            other = {n: [m for m in MODALITIES if resolve_transform(n, m)] for n in wrong}
            what = ", ".join(
                f"{n!r} ({'an ' + '/'.join(other[n]) + ' transform' if other[n] else 'unknown'})"
                for n in wrong
            )
            raise ConfigError(
                f"--tta_transforms {what} does not apply to {self.model_type}; its {modality} transforms: "
                f"{transform_names(modality)}",
                hint=f"choose --tta_transforms from the {modality} transforms",
            )
        canonical = tuple(resolve_transform(n, modality) or n for n in self.tta_transforms)
        object.__setattr__(self, "tta_transforms", canonical)

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

    def search_space(self, has_dropout: bool = True, twin: str | None = None) -> PolicySearchSpace:
        """What the policy search may try: the settings the user fixed as given, the others open (MC dropout
        when the exported model has Dropout, the ensemble with ``twin``, the other precision's model, when
        there is an int8 model)."""
        spec = NETWORKS[self.model_type]
        mc = self.mc_dropout if self.mc_dropout is not None else DEFAULT_MC_PASSES
        mc = mc if has_dropout else 0
        ensemble = (
            self.ensemble if self.ensemble is not None else ("int8" if self.quantize != "none" else "none")
        )
        fixed = [
            name
            for name, given in (
                ("tta", "tta" in self.user_set),
                ("ttt", "ttt" in self.user_set),
                ("mc_dropout", self.mc_dropout is not None),
                ("ensemble", self.ensemble is not None),
            )
            if given
        ]
        return PolicySearchSpace(
            tta=self.tta is not False,
            tta_transforms=self.tta_transforms,
            tta_aggregate=self.tta_aggregate,
            ttt=bool(self.ttt) if self.ttt is not None else spec.has_batchnorm,
            ttt_method=self.ttt_method,
            ttt_iterations=self.ttt_iterations,
            learning_rate=self.learning_rate,
            mc_dropout=mc,
            ensemble=(twin,) if ensemble == "int8" and twin else (),
            fixed=tuple(fixed),
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
        out["user_set"] = list(self.user_set)
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
