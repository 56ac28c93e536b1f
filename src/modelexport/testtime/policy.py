"""``TestTimePolicy``: how much test-time compute to spend, as one frozen, validated, serializable config.

The pipeline engineer's policy search and the inference pipelines build policies and store them in the
model metadata (``modelexport.test_time_policy``) via ``to_dict()`` / ``from_dict()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .._config import split_names
from ..errors import TestTimeError
from .aggregate import AGGREGATORS
from .augment import MODALITIES, transforms_for
from .registry import Registry

__all__ = ["MAX_PASSES", "TestTimePolicy", "ADAPTATION_METHODS", "POLICY_PRESETS", "policy_preset"]

#: Test-time training methods: name -> one-line description (the engine dispatches on the name).
ADAPTATION_METHODS: Registry[str] = Registry("test-time adaptation method")
ADAPTATION_METHODS.add("none", "no adaptation: the exported model as is")
ADAPTATION_METHODS.add("bn", "BatchNorm statistics from the test batch, computed with ONNX Runtime")
ADAPTATION_METHODS.add("tent", "entropy minimisation of the BN affine parameters (Tent), then BN statistics")


#: Most passes (adaptation iterations, MC dropout samples) a policy may ask for per batch.
MAX_PASSES = 10_000
_NUMBER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "ttt_iterations": int,
    "mc_dropout": int,
    "seed": int,
    "momentum": (int, float),
    "learning_rate": (int, float),
    "adaptive_threshold": (int, float),
}


@dataclass(frozen=True)
class TestTimePolicy:
    """Test-time augmentation, adaptation, MC dropout; the defaults spend no extra compute."""

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
    #: BN: statistics passes (None: one per BN layer, which equals train-mode BatchNorm on the batch);
    #: Tent: gradient steps per batch (None: 1, as in the paper).
    ttt_iterations: int | None = None
    momentum: float = 1.0
    learning_rate: float = 1e-3
    #: Reset the adaptation after every batch (False: a stream keeps adapting).
    episodic: bool = True
    mc_dropout: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tta_transforms", split_names(self.tta_transforms))
        if self.modality not in (*MODALITIES, "auto"):
            raise TestTimeError(
                f"modality must be one of auto, {', '.join(MODALITIES)}, got {self.modality!r}"
            )
        modalities = MODALITIES if self.modality == "auto" else (self.modality,)
        unknown = [n for n in self.tta_transforms if not any(n in transforms_for(m) for m in modalities)]
        if unknown:
            valid = "; ".join(f"{m}: {', '.join(transforms_for(m))}" for m in modalities)
            raise TestTimeError(
                f"unknown TTA transform(s) {unknown}; valid ({valid})",
                hint="choose --tta-transforms from the list",
            )
        AGGREGATORS.get(self.tta_aggregate)
        ADAPTATION_METHODS.get(self.ttt)
        if self.adaptive_threshold is not None and not 0.0 < self.adaptive_threshold <= 1.0:
            raise TestTimeError(f"adaptive_threshold must be in (0, 1], got {self.adaptive_threshold}")
        self._check_types()
        if self.ttt_iterations is not None and not 1 <= self.ttt_iterations <= MAX_PASSES:
            raise TestTimeError(f"ttt_iterations must be in [1, {MAX_PASSES:,}], got {self.ttt_iterations}")
        if not 0.0 < self.momentum <= 1.0:
            raise TestTimeError(f"momentum must be in (0, 1], got {self.momentum}")
        if self.learning_rate <= 0:
            raise TestTimeError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mc_dropout < 0 or self.mc_dropout == 1 or self.mc_dropout > MAX_PASSES:
            raise TestTimeError(
                f"mc_dropout is the number of passes: 0 (off) or 2..{MAX_PASSES:,}, got {self.mc_dropout}"
            )

    def _check_types(self) -> None:
        """Numbers are numbers (a policy may come from a file: metadata, --policy JSON)."""
        for name, kinds in _NUMBER_FIELDS.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise TestTimeError(
                    f"{name} must be {'an integer' if kinds is int else 'a number'}, got {value!r}"
                )

    @property
    def is_plain(self) -> bool:
        """True when the policy spends no extra compute (one plain run)."""
        return not self.tta_transforms and self.ttt == "none" and not self.mc_dropout

    def with_changes(self, **changes: Any) -> TestTimePolicy:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tta_transforms"] = list(self.tta_transforms)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestTimePolicy:
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise TestTimeError(f"unknown test-time policy keys {unknown}; valid: {', '.join(sorted(valid))}")
        values = dict(data)
        if isinstance(values.get("tta_transforms"), list):
            values["tta_transforms"] = tuple(values["tta_transforms"])
        return cls(**values)


#: Named policies (a starting point for ``--policy NAME`` and for the policy search).
POLICY_PRESETS: dict[str, TestTimePolicy] = {
    "none": TestTimePolicy(),
    "flip": TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image"),
    "bn": TestTimePolicy(ttt="bn"),
    "flip+bn": TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image", ttt="bn"),
    "tent": TestTimePolicy(ttt="tent"),
    "mc-dropout": TestTimePolicy(mc_dropout=16),
}


def policy_preset(name: str) -> TestTimePolicy:
    if name not in POLICY_PRESETS:
        raise TestTimeError(f"unknown test-time policy preset {name!r}; valid: {', '.join(POLICY_PRESETS)}")
    return POLICY_PRESETS[name]
