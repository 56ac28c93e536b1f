"""``TestTimePolicy``: how much test-time compute to spend, as one frozen, validated, serializable config.

The pipeline engineer's policy search and the inference pipelines build policies and store them in the
model metadata (``modelexport.test_time_policy``) via ``to_dict()`` / ``from_dict()``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .._config import closest, replace_checked, split_names
from .._numeric import MAX_SEED, is_seed
from .._registry import Registry
from ..errors import TestTimeError
from .aggregate import AGGREGATORS
from .augment import MODALITIES, resolve_transform, transform_names, transforms_for
from .methods import ADAPTATION_METHODS

__all__ = [
    "MAX_PASSES",
    "STATISTICS",
    "TestTimePolicy",
    "ADAPTATION_METHODS",
    "POLICY_PRESETS",
    "policy_preset",
]


#: Most passes (adaptation iterations, MC dropout samples) a policy may ask for per batch.
MAX_PASSES = 10_000
#: Most examples a stream's statistics memory may hold.
MAX_MEMORY = 100_000

#: The hint of a number out of its range (the message names the option, its range and the value).
VALUE_HINT = "choose a value in the stated range (modelexport evaluate --help lists the test-time options)"

#: Where BN statistics come from (``--statistics``).
STATISTICS: Registry[str] = Registry(
    "BN statistics source", error=TestTimeError, hint="choose the BN statistics source from the list"
)
STATISTICS.add(
    "memory",
    "robust: a class-balanced memory of the stream's recent examples blended with the source, the batch itself "
    "in stem layers only (testtime/memory.py); right for any stream order and batch size",
)
STATISTICS.add(
    "batch",
    "each batch's own statistics (blended with the source by bn_prior, or a running average by momentum when "
    "continual); right for i.i.d. batches of 16 or more only, the label-shift guard serves other batches plainly",
)
_NUMBER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "ttt_iterations": int,
    "mc_dropout": int,
    "seed": int,
    "momentum": (int, float),
    "learning_rate": (int, float),
    "adaptive_threshold": (int, float),
    "label_shift_alpha": (int, float),
    "memory_size": int,
    "stem_prior": (int, float),
    "deep_prior": (int, float),
    "shift_gate": (int, float),
    "denoise": (int, float),
    "sharpen": (int, float),
    "step_layers": int,
}


_BOOL_FIELDS = ("batched", "episodic", "prior_correction", "anchors")


def _canonical(names: tuple[str, ...], modalities: tuple[str, ...]) -> tuple[str, ...]:
    """Aliases (``flip``, ``rotate``) as the registered names they stand for, where a modality has them."""

    def one(name: str) -> str:
        if any(name in transforms_for(m) for m in modalities):
            return name
        return next((r for m in modalities if (r := resolve_transform(name, m))), name)

    return tuple(one(n) for n in names)


@dataclass(frozen=True)
class TestTimePolicy:
    """Test-time augmentation, adaptation, MC dropout; the defaults spend no extra compute.

    Adaptation (``ttt``) is continual by default: a stream (``TestTimeEngine.new_stream()``; evaluate keeps
    one) carries its statistics memory from batch to batch. Its defaults are the robust ``memory`` statistics,
    tuned once on corrupted digits and measured on held-out corruptions and a second dataset
    (``benchmarks/test_time.py``).
    """

    __test__ = False  # not a pytest class

    tta_transforms: tuple[str, ...] = ()
    tta_aggregate: str = "mean"
    #: Input modality for TTA: image (NCHW), text (strings before tokenization), tensor; auto: from the input.
    modality: str = "auto"
    #: Adaptive TTA: augment only rows whose plain-run confidence is below this (None: augment every row).
    adaptive_threshold: float | None = None
    #: Run all views in one batch when the batch axis is dynamic (sequential otherwise).
    batched: bool = True
    ttt: str = "none"
    #: Where BN statistics come from (``STATISTICS``): ``memory`` (robust, any stream) or ``batch``.
    statistics: str = "memory"
    #: memory: examples the class-balanced statistics memory of a stream holds.
    memory_size: int = 128
    #: memory: the source statistics' weight, in examples, in the stem BN layers (no BN upstream), which also
    #: take the current batch's own statistics (on a class-ordered stream as far as the stem sees a shift).
    stem_prior: float = 16.0
    #: memory: the source statistics' weight, in examples, in the deeper BN layers (memory only, never the
    #: batch itself: a class-sorted batch must not normalise its own class-specific features; the memory
    #: counts there by the square of the share of the classes it covers).
    deep_prior: float = 64.0
    #: memory: the stem layers' variances adapt only once the memory's differ from the source's by more than
    #: this (nats a channel: the variance part of the KL divergence; fully from twice it); their means always
    #: follow; the excess noise the input denoising takes out opens it too (``memory.NOISE_GATE``); a stream's
    #: first batch, with no memory yet, measures it on its own statistics. A clean stream keeps the source's stem
    #: variances; while it is shut on a stream of restored inputs, the deep layers' source counts
    #: ``memory.SHUT_PRIOR`` times; a class-ordered stream's batch of ``streams.MIN_BATCH`` or more counts in the
    #: stem only as far as the stem's own shift opens it (0: no gate, none of these).
    shift_gate: float = 0.1
    #: Adapting methods on image inputs of a model that records its source's noise (``modelexport.input_noise``,
    #: written by the image pipeline): each example moves toward its blur by this times its squared noise ratio
    #: above the source's, at most all the way (``denoise.py``). None: the strength the record calibrated; 0: off.
    denoise: float | None = None
    #: The same models: an example smoother than the source's images (a blur) is sharpened by an unsharp mask of
    #: this times the gain that brings its detail back to theirs (``denoise.py``), as far as the stream's mean
    #: detail deficit opens it (from ``memory.BLUR_GATE`` to twice that: a mild blur is left as it is). None: the
    #: strength the record calibrated; 0: off.
    sharpen: float | None = None
    #: memory: where the model records source anchors (``modelexport.source_anchors``, written by the image
    #: pipeline) and a stream's inputs were noisy beyond the source's, the deeper BN layers' source variances are
    #: measured again on the anchors under the stream's statistics, scaled by how the stream's examples differ
    #: from the anchors of their predicted classes, and their means moved by that difference while the memory
    #: lacks classes (``anchors.py``). False: the source's.
    anchors: bool = True
    #: batch statistics: passes (None: one per BN layer, which equals train-mode BatchNorm on the batch);
    #: Tent / sar: gradient steps per batch (None: 1, as in the paper).
    ttt_iterations: int | None = None
    #: batch statistics: weight of this batch's BN statistics against the prior (the source, or the stream's
    #: running statistics when not episodic): 1 = this batch only; < 1 = running statistics by this momentum.
    momentum: float = 1.0
    #: batch statistics: strength of the prior in pseudo-examples: a batch of n gets weight
    #: momentum * n / (n + bn_prior) (0: the batch alone).
    bn_prior: float = 0.0
    learning_rate: float = 1e-3
    #: Reset the adaptation after every batch (False: a stream keeps adapting, continual).
    episodic: bool = False
    #: Continual: reset the stream to the source every this many batches (None: never).
    reset_every: int | None = None
    #: Collapse guard: reset the stream to the source when the entropy of the predicted classes over the last
    #: ``collapse_window`` predictions falls below this fraction of log(C) (0: off).
    collapse_threshold: float = 0.2
    collapse_window: int = 256
    #: Label-shift guard for batch-statistics methods (``batch_statistics``): a batch whose recent predicted
    #: classes fail a G-test against the stream's label history at this significance, or smaller than
    #: ``streams.MIN_BATCH``, is served by the source model (0: off).
    label_shift_alpha: float = 0.001
    #: Reweight the outputs by the label distribution of the last 64 predictions (ROID's prior correction).
    prior_correction: bool = False
    #: sar: learn only from examples with entropy below this fraction of log(C) (EATA's 0.4).
    reliable_entropy: float = 0.4
    #: tent / sar with the memory statistics: the last this many BN layers' scale/bias are trained, and torch
    #: runs the graph from the first of them on (0: every BN layer, the whole graph); ``tail.py``.
    step_layers: int = 1
    mc_dropout: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tta_transforms", split_names(self.tta_transforms))
        if self.modality not in (*MODALITIES, "auto"):
            raise TestTimeError(
                f"modality must be one of auto, {', '.join(MODALITIES)}, got {self.modality!r}"
            )
        modalities = MODALITIES if self.modality == "auto" else (self.modality,)
        object.__setattr__(self, "tta_transforms", _canonical(self.tta_transforms, modalities))
        unknown = [n for n in self.tta_transforms if not any(n in transforms_for(m) for m in modalities)]
        if unknown:
            valid = "; ".join(f"{m}: {transform_names(m)}" for m in modalities)
            raise TestTimeError(
                f"unknown TTA transform(s) {unknown}{_did_you_mean(unknown, modalities)}; valid ({valid})",
                hint="choose --tta-transforms from the list",
            )
        AGGREGATORS.get(self.tta_aggregate)
        ADAPTATION_METHODS.get(self.ttt)
        STATISTICS.get(self.statistics)
        self._check_types()
        self._check_ranges()
        self._check_memory()

    def _check_ranges(self) -> None:
        """Every number in its range, NaN and infinities refused (each check is written as "ok": NaN fails it)."""
        checks = [
            ("seed", is_seed(self.seed), f"an integer in [0, {MAX_SEED:,}]"),
            (
                "adaptive_threshold",
                self.adaptive_threshold is None or 0.0 < self.adaptive_threshold <= 1.0,
                "in (0, 1]",
            ),
            (
                "ttt_iterations",
                self.ttt_iterations is None or 1 <= self.ttt_iterations <= MAX_PASSES,
                f"in [1, {MAX_PASSES:,}]",
            ),
            ("momentum", 0.0 < self.momentum <= 1.0, "in (0, 1]"),
            ("bn_prior", 0.0 <= self.bn_prior < math.inf, "a finite number >= 0 (pseudo-examples)"),
            ("reset_every", self.reset_every is None or self.reset_every >= 1, ">= 1 batches"),
            ("collapse_threshold", 0.0 <= self.collapse_threshold < 1.0, "in [0, 1) (a fraction of log C)"),
            ("collapse_window", self.collapse_window >= 1, ">= 1 predictions"),
            ("label_shift_alpha", 0.0 <= self.label_shift_alpha < 0.5, "in [0, 0.5) (0: off)"),
            ("reliable_entropy", 0.0 < self.reliable_entropy <= 1.0, "in (0, 1] (a fraction of log C)"),
            ("learning_rate", 0.0 < self.learning_rate < math.inf, "a finite number > 0"),
            (
                "denoise",
                self.denoise is None or 0.0 <= self.denoise < math.inf,
                "a finite number >= 0 (0: off; None: the model's calibrated strength)",
            ),
            (
                "sharpen",
                self.sharpen is None or 0.0 <= self.sharpen < math.inf,
                "a finite number >= 0 (0: off; None: the model's calibrated strength)",
            ),
            (
                "step_layers",
                0 <= self.step_layers <= MAX_PASSES,
                f"in [0, {MAX_PASSES:,}] (0: every BN layer)",
            ),
            (
                "mc_dropout",
                self.mc_dropout == 0 or 2 <= self.mc_dropout <= MAX_PASSES,
                f"the number of passes: 0 (off) or 2..{MAX_PASSES:,}",
            ),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise TestTimeError(f"{name} must be {valid}, got {getattr(self, name)!r}", hint=VALUE_HINT)

    def _check_memory(self) -> None:
        if not 1 <= self.memory_size <= MAX_MEMORY:
            raise TestTimeError(
                f"memory_size must be in [1, {MAX_MEMORY:,}] examples, got {self.memory_size}",
                hint=VALUE_HINT,
            )
        for name, unit in (("stem_prior", "examples"), ("deep_prior", "examples"), ("shift_gate", "nats")):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise TestTimeError(
                    f"{name} must be a finite number of {unit} >= 0, got {value}", hint=VALUE_HINT
                )
        if self.statistics == "memory" and (self.momentum != 1.0 or self.bn_prior != 0.0):
            raise TestTimeError(
                "momentum and bn_prior weigh batch statistics; the memory statistics take memory_size, "
                f"stem_prior and deep_prior (got momentum={self.momentum}, bn_prior={self.bn_prior})",
                hint="add statistics='batch' (--statistics batch) to use momentum / bn_prior",
            )

    def _check_types(self) -> None:
        """Numbers are numbers and switches booleans (a policy may come from a file: metadata, --policy JSON)."""
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise TestTimeError(
                    f"{name} must be true or false, got {getattr(self, name)!r}", hint=VALUE_HINT
                )
        for name, kinds in _NUMBER_FIELDS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise TestTimeError(
                    f"{name} must be {'an integer' if kinds is int else 'a number'}, got {value!r}",
                    hint=VALUE_HINT,
                )

    @property
    def is_plain(self) -> bool:
        """True when the policy spends no extra compute (one plain run)."""
        return (
            not self.tta_transforms
            and self.ttt == "none"
            and not self.mc_dropout
            and not self.prior_correction
        )

    @property
    def batch_statistics(self) -> bool:
        """BN statistics come from each batch itself (``statistics="batch"``, episodic or continual without a
        running average): right on i.i.d. batches, wrong on label-shifted ones -- the label-shift guard
        applies."""
        return self.ttt != "none" and self.statistics == "batch" and (self.episodic or self.momentum >= 1.0)

    @property
    def continual(self) -> bool:
        """The policy adapts along a stream (its state carries from one batch to the next)."""
        return self.ttt != "none" and not self.episodic

    def with_changes(self, **changes: object) -> TestTimePolicy:
        return replace_checked(self, "test-time policy", changes, TestTimeError)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tta_transforms"] = list(self.tta_transforms)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestTimePolicy:
        """The policy ``to_dict`` wrote (or any subset of its keys). A policy stored before ``statistics``
        existed (every key, ``episodic`` among them) keeps its meaning: ``statistics="batch"``."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise TestTimeError(f"unknown test-time policy keys {unknown}; valid: {', '.join(sorted(valid))}")
        values = dict(data)
        if "episodic" in values and "statistics" not in values:  # a to_dict() from before the memory
            values["statistics"] = "batch"
        if isinstance(values.get("tta_transforms"), list):
            values["tta_transforms"] = tuple(values["tta_transforms"])
        return cls(**values)


#: Named policies (a starting point for ``--policy NAME`` and for the policy search).
POLICY_PRESETS: dict[str, TestTimePolicy] = {
    "none": TestTimePolicy(),
    "flip": TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image"),
    "bn": TestTimePolicy(ttt="bn"),
    #: The memory statistics adapting four times slower: for networks whose early layers tell classes apart
    #: (the image pipeline's own, measured: within 1 point of plain on class-sorted batches of 32-64 where the
    #: default falls 1.5-2 points below); the pipeline's policy search validates it beside ``bn``.
    "bn-cautious": TestTimePolicy(ttt="bn", stem_prior=64.0, deep_prior=128.0),
    "flip+bn": TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image", ttt="bn"),
    "tent": TestTimePolicy(ttt="tent"),
    "sar": TestTimePolicy(ttt="sar"),
    #: Each batch's own statistics, reset per batch (the default before the memory statistics).
    "bn-exact": TestTimePolicy(ttt="bn", statistics="batch", episodic=True),
    "bn-prior": TestTimePolicy(ttt="bn", statistics="batch", episodic=True, bn_prior=16.0),
    "bn-stream": TestTimePolicy(
        ttt="bn", statistics="batch", momentum=0.05, bn_prior=64.0, prior_correction=True
    ),
    "mc-dropout": TestTimePolicy(mc_dropout=16),
}


def _did_you_mean(unknown: list[str], modalities: tuple[str, ...]) -> str:
    """`` (did you mean 'hflip'?)`` for the first unknown transform name close to a valid one."""
    valid = [n for m in modalities for n in transforms_for(m)]
    guess = next((g for g in (closest(n, valid) for n in unknown) if g), None)
    return f" (did you mean {guess!r}?)" if guess else ""


def policy_preset(name: str) -> TestTimePolicy:
    if name not in POLICY_PRESETS:
        raise TestTimeError(f"unknown test-time policy preset {name!r}; valid: {', '.join(POLICY_PRESETS)}")
    return POLICY_PRESETS[name]
