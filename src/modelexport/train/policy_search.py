"""``TestTimePolicyOptimizer``: a DSPy teleprompter that chooses how much test-time compute to spend.

It searches TTA transform sets, aggregations and BN adaptation (the robust memory statistics, alone and
with the best TTA set) on a validation set, measuring accuracy (``dspy.Evaluate``) *and* latency, and keeps
the most accurate policy within the latency budget. Real streams are not i.i.d. (an image folder is read
class by class), so every candidate is measured on the validation set streamed in each of ``orders``
(default: stratified shuffled batches, class-sorted ones and Dirichlet(0.1)-correlated ones); a candidate is
kept only if it is not worse than plain inference in any order, and its accuracy is its worst order's.
Exact per-batch BN statistics are not proposed: on correlated streams they only help where the label-shift
guard serves batches plainly (``benchmarks/test_time.py``). The plain policy is always a candidate, so the
choice is never less accurate than plain inference on the set and orders it was chosen on; the result records
those stream assumptions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import dspy
import numpy as np
from dspy.teleprompt import Teleprompter

from .._config import split_names
from ..errors import ConfigError, TestTimeError, TrainingError
from ..testtime.aggregate import AGGREGATORS
from ..testtime.augment import transforms_for
from ..testtime.policy import POLICY_PRESETS, TestTimePolicy
from ..testtime.streams import StreamOrder
from .program import ClassifierProgram, Metric, OnnxBackend, label_accuracy
from .settings import SETTINGS, TTT_METHODS
from .weights import evaluate_program

__all__ = [
    "PolicySearchSpace",
    "PolicyTrial",
    "PolicySearchResult",
    "TestTimePolicyOptimizer",
    "measure_policy",
    "measure_streams",
    "DEFAULT_ORDERS",
    "describe_policy",
    "DEFAULT_TTA_SETS",
    "DEFAULT_AGGREGATES",
    "ttt_policy",
]

log = logging.getLogger(__name__)


class Trial(Protocol):
    """One candidate tried on the validation streams: its trial, or None when the model cannot run it."""

    def __call__(self, policy: TestTimePolicy, members: tuple[str, ...] = ()) -> PolicyTrial | None: ...


#: Candidate TTA sets per modality when the user names none (each is one candidate).
DEFAULT_TTA_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "image": (
        ("identity", "hflip"),
        ("identity", "five_crop"),
        ("identity", "scale"),
        ("identity", "brightness", "contrast"),
    ),
    "text": (("identity", "word_dropout"), ("identity", "lower")),
    "tensor": (("identity", "gaussian_noise"),),
}
DEFAULT_AGGREGATES = ("mean", "geometric_mean")
#: Stream orders every candidate is validated under.
DEFAULT_ORDERS = ("stratified", "class-sorted", "dirichlet:0.1")
#: The adaptation candidates: BN with the memory statistics (continual, one ONNX Runtime pass per batch), at
#: the default pace and four times slower (``bn-cautious``: safe on networks whose early layers tell classes
#: apart, where the default is not; each is kept only where it is not below plain on every order).
ROBUST_BN = (POLICY_PRESETS["bn"], POLICY_PRESETS["bn-cautious"])


@dataclass(frozen=True)
class PolicySearchSpace:
    """What may be tried; ``tta_transforms``/``tta_aggregate`` fix those dimensions when given."""

    tta: bool = True
    tta_transforms: tuple[str, ...] = ()
    tta_aggregate: str | None = None
    ttt: bool = True
    ttt_iterations: int | None = 1
    #: The adaptation method of the TTT candidates: bn (memory statistics; with ``ttt_iterations`` > 1, that
    #: many passes of batch statistics), tent or sar (``ttt_iterations`` gradient steps at ``learning_rate``).
    ttt_method: str = "bn"
    learning_rate: float | None = None
    #: MC-dropout passes a candidate tries (0: none; needs Dropout kept in the export).
    mc_dropout: int = 0
    #: Extra ensemble members a candidate tries (the model with these, probabilities averaged), e.g. its int8 twin.
    ensemble: tuple[str, ...] = ()
    #: The settings the user fixed, by name (tta, ttt, mc_dropout, ensemble): every candidate has them on
    #: (or off) as the space says, and plain inference is chosen only when none is fixed on.
    fixed: tuple[str, ...] = ()
    latency_budget_ms: float | None = None
    max_examples: int = 1000
    seed: int = 0
    #: Stream orders (``StreamOrder`` specs) each candidate must not lose to plain inference on.
    orders: tuple[str, ...] = DEFAULT_ORDERS

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", split_names(self.orders))
        if not self.orders:
            raise ConfigError("the policy search needs at least one stream order")
        for spec in self.orders:
            StreamOrder.parse(spec)  # unknown orders fail here, listing the valid ones
        if isinstance(self.tta_transforms, str):
            object.__setattr__(self, "tta_transforms", split_names(self.tta_transforms))
        TestTimePolicy(tta_transforms=self.tta_transforms)  # unknown names fail here, listing the valid ones
        if self.tta_aggregate is not None:
            AGGREGATORS.get(self.tta_aggregate)
        if self.ttt_iterations is not None and self.ttt_iterations < 1:
            raise ConfigError(f"ttt_iterations must be >= 1, got {self.ttt_iterations}")
        if self.ttt_method not in TTT_METHODS:
            raise ConfigError(f"ttt method must be one of {', '.join(TTT_METHODS)}, got {self.ttt_method!r}")
        if self.mc_dropout < 0 or self.mc_dropout == 1:
            raise ConfigError(f"mc_dropout is a number of passes: 0 (off) or >= 2, got {self.mc_dropout}")
        object.__setattr__(self, "ensemble", tuple(str(m) for m in self.ensemble))
        object.__setattr__(self, "fixed", split_names(self.fixed))
        unknown = sorted(set(self.fixed) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown fixed settings {unknown}; valid: {', '.join(SETTINGS)}")
        if self.latency_budget_ms is not None and self.latency_budget_ms <= 0:
            raise ConfigError(f"latency_budget_ms must be > 0, got {self.latency_budget_ms}")
        if self.max_examples < 1:
            raise ConfigError(f"max_examples must be >= 1, got {self.max_examples}")

    def tta_candidates(self, modality: str) -> list[tuple[tuple[str, ...], str]]:
        if not self.tta:
            return []
        valid = set(transforms_for(modality))
        sets = [self.tta_transforms] if self.tta_transforms else list(DEFAULT_TTA_SETS.get(modality, ()))
        sets = [s for s in sets if set(s) <= valid]
        aggregates = (self.tta_aggregate,) if self.tta_aggregate else DEFAULT_AGGREGATES
        return [(s, a) for s in sets for a in aggregates]

    def ttt_candidates(self) -> list[TestTimePolicy]:
        """The adaptation candidates: robust BN (memory statistics), or the method and its settings given."""
        if not self.ttt:
            return []
        if self.ttt_method == "bn" and (self.ttt_iterations or 1) == 1:
            return list(ROBUST_BN)
        return [ttt_policy(self.ttt_method, self.ttt_iterations, self.learning_rate)]

    def allows(self, policy: TestTimePolicy, members: tuple[str, ...]) -> bool:
        """Whether a candidate keeps every fixed setting as the space says (on with its values, or off)."""
        state = {
            "tta": bool(policy.tta_transforms) == self.tta,
            "ttt": (policy.ttt != "none") == self.ttt,
            "mc_dropout": policy.mc_dropout == self.mc_dropout,
            "ensemble": members == self.ensemble,
        }
        return all(state[name] for name in self.fixed)


@dataclass
class PolicyTrial:
    """One measured candidate: validation accuracy (its worst stream order's), the accuracy per order, and
    p50 latency per request of ``batch_size`` examples."""

    policy: TestTimePolicy
    accuracy: float
    latency_ms: float
    within_budget: bool = True
    by_order: dict[str, float] = field(default_factory=dict)
    #: Not worse than plain inference in every order (set by the search).
    safe: bool = True
    #: Extra ensemble members (model paths) beside the deployed model.
    ensemble: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "ensemble": list(self.ensemble),
            "accuracy": round(self.accuracy, 5),
            "accuracy_by_order": {k: round(v, 5) for k, v in self.by_order.items()},
            "latency_ms": round(self.latency_ms, 3),
            "within_budget": self.within_budget,
            "not_worse_than_plain": self.safe,
        }


@dataclass
class PolicySearchResult:
    best: PolicyTrial
    plain: PolicyTrial
    trials: list[PolicyTrial] = field(default_factory=list)
    n_examples: int = 0
    notes: list[str] = field(default_factory=list)
    orders: tuple[str, ...] = DEFAULT_ORDERS
    batch_size: int = 0

    @property
    def stream_assumptions(self) -> dict[str, Any]:
        """What the chosen policy was validated under: orders, batch size, episodic or continual."""
        return {
            "orders": list(self.orders),
            "batch_size": self.batch_size,
            "adaptation": "episodic" if self.best.policy.episodic else "continual",
            "accuracy_by_order": {k: round(v, 5) for k, v in self.best.by_order.items()},
            "plain_accuracy_by_order": {k: round(v, 5) for k, v in self.plain.by_order.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict(),
            "plain": self.plain.to_dict(),
            "trials": [t.to_dict() for t in self.trials],
            "n_examples": self.n_examples,
            "notes": self.notes,
            "stream_assumptions": self.stream_assumptions,
        }


class TestTimePolicyOptimizer(Teleprompter):
    """Pick the most accurate test-time policy within a latency budget for a *deployed* program."""

    __test__ = False

    def __init__(self, space: PolicySearchSpace | None = None, **options: Any) -> None:
        super().__init__()
        self.space = PolicySearchSpace(**options) if space is None else space
        self.result: PolicySearchResult | None = None

    def compile(
        self,
        student: ClassifierProgram,
        *,
        trainset: list[dspy.Example],
        teacher: dspy.Module | None = None,
        valset: list[dspy.Example] | None = None,
        metric: Metric = label_accuracy,
        **kwargs: object,
    ) -> ClassifierProgram:
        """Choose on ``valset`` (``trainset`` when no valset is given); returns ``student`` deployed with the best policy."""
        backend = student.backend
        if not isinstance(backend, OnnxBackend):
            raise TrainingError(
                "TestTimePolicyOptimizer needs a deployed program: call program.deploy(model.onnx) first"
            )
        examples = list(valset or trainset)
        if not examples:
            raise TrainingError("the policy search needs validation examples")
        if len(examples) > self.space.max_examples:
            rng = np.random.default_rng(self.space.seed)
            examples = [
                examples[i] for i in sorted(rng.choice(len(examples), self.space.max_examples, replace=False))
            ]
        model_path, providers = backend.model_path, backend.providers
        notes: list[str] = []

        streams = _streams(examples, self.space.orders, self.space.seed)

        def trial(policy: TestTimePolicy, members: tuple[str, ...] = ()) -> PolicyTrial | None:
            try:  # a candidate the model cannot run (no Dropout, an operator Tent cannot differentiate)
                student.deploy(model_path, providers, policy, ensemble=members)
                result = measure_streams(student, policy, streams, metric, (model_path, providers), members)
            except TestTimeError as exc:
                notes.append(f"skipped {_label(policy, members)}: {exc}")
                log.info("policy %s skipped: %s", _label(policy, members), exc)
                return None
            result.ensemble = members
            return result

        plain = trial(TestTimePolicy())
        assert plain is not None  # a plain policy needs nothing of the model
        trials = [plain]
        modality = student.backend.engine.modality  # type: ignore[union-attr]
        tta = [
            t for s, agg in self.space.tta_candidates(modality) if (t := trial(_policy(self.space, s, agg)))
        ]
        ttt = [t for p in self.space.ttt_candidates() if (t := trial(p))]
        trials += tta + ttt
        if tta and ttt:
            best_tta = max(tta, key=lambda t: (t.accuracy, -t.latency_ms)).policy
            for p in self.space.ttt_candidates():
                combined = trial(
                    p.with_changes(
                        tta_transforms=best_tta.tta_transforms,
                        tta_aggregate=best_tta.tta_aggregate,
                        seed=best_tta.seed,
                    )
                )
                if combined:
                    trials.append(combined)
        trials += self._extras(trials, trial)
        for t in trials:
            t.safe = all(t.by_order[o] >= plain.by_order[o] for o in plain.by_order)
        best = self._choose(trials, plain)
        student.deploy(model_path, providers, best.policy, ensemble=best.ensemble)
        self.result = PolicySearchResult(
            best, plain, trials, len(examples), notes, self.space.orders, student.batch_size
        )
        student.policy_search = self.result
        return student

    def _extras(self, trials: list[PolicyTrial], trial: Trial) -> list[PolicyTrial]:
        """MC dropout and the ensemble, each tried on the best candidate so far (the one the user's fixed
        settings allow when there is one): both multiply the cost of whatever they wrap."""
        space, out = self.space, []
        fixed = [t for t in trials if _allows_base(space, t.policy)]
        base = max(fixed or trials, key=lambda t: (t.accuracy, -t.latency_ms)).policy
        if space.mc_dropout:
            mc = trial(base.with_changes(mc_dropout=space.mc_dropout))
            if mc:
                out.append(mc)
        if space.ensemble:
            bases = [base] + ([out[0].policy] if out and "mc_dropout" in space.fixed else [])
            out += [t for b in bases if (t := trial(b, space.ensemble))]
        return out

    def _choose(self, trials: list[PolicyTrial], plain: PolicyTrial) -> PolicyTrial:
        budget = self.space.latency_budget_ms
        for t in trials:
            t.within_budget = budget is None or t.latency_ms <= budget
        allowed = [t for t in trials if self.space.allows(t.policy, t.ensemble)]
        eligible = [t for t in allowed if t.within_budget and t.safe]
        if not eligible and allowed:  # what the user fixed runs even where it loses to plain inference
            eligible = [t for t in allowed if t.within_budget] or allowed
        if not eligible:
            log.warning(
                "no policy meets the %.1f ms budget (plain takes %.1f ms); keeping plain inference",
                budget,
                plain.latency_ms,
            )
            return plain
        # Ties in accuracy go to the faster policy; the plain one usually wins them.
        return max(eligible, key=lambda t: (t.accuracy, -t.latency_ms))


def measure_policy(
    program: ClassifierProgram,
    policy: TestTimePolicy,
    examples: list[dspy.Example],
    metric: Metric = label_accuracy,
    warm_up: bool = True,
) -> PolicyTrial:
    """Accuracy (``dspy.Evaluate``) and p50 latency per batch of the program as currently deployed.

    Accuracy first, on a fresh deployment: a continual policy adapts along ``examples`` in their order.
    """
    inputs = [ex[program.input_field] for ex in examples]
    size = program.batch_size
    accuracy = evaluate_program(program, examples, metric)
    if warm_up:
        program.predict_batch(inputs[:size])  # warm-up (session start, first-run allocations)
    times = []
    for i in range(0, len(inputs), size):
        start = time.perf_counter()
        program.probabilities(inputs[i : i + size])
        times.append((time.perf_counter() - start) * 1000.0)
    trial = PolicyTrial(policy, accuracy, float(np.median(times)))
    log.info(
        "policy %s: accuracy %.4f, %.2f ms per batch of %d", _label(policy), accuracy, trial.latency_ms, size
    )
    return trial


def _streams(
    examples: list[dspy.Example], orders: tuple[str, ...], seed: int
) -> dict[str, list[dspy.Example]]:
    """The validation examples streamed in each order (labels by name; seeded)."""
    names = sorted({str(ex.label) for ex in examples})
    labels = np.asarray([names.index(str(ex.label)) for ex in examples])
    return {o: [examples[i] for i in StreamOrder.parse(o, seed).indices(labels)] for o in orders}


def measure_streams(
    program: ClassifierProgram,
    policy: TestTimePolicy,
    streams: dict[str, list[dspy.Example]],
    metric: Metric,
    deployment: tuple[Path, tuple[str, ...]],
    ensemble: tuple[str, ...] = (),
) -> PolicyTrial:
    """``measure_policy`` per stream order, each on a fresh deployment (a continual policy starts from the
    source); the trial's accuracy is the worst order's, its latency the first order's."""
    by_order: dict[str, float] = {}
    first: PolicyTrial | None = None
    for order, examples in streams.items():
        program.deploy(*deployment, policy, ensemble=ensemble)
        trial = measure_policy(program, policy, examples, metric, warm_up=first is None)
        by_order[order] = trial.accuracy
        first = first or trial
    assert first is not None
    return PolicyTrial(policy, min(by_order.values()), first.latency_ms, by_order=by_order)


def _policy(space: PolicySearchSpace, transforms: tuple[str, ...], aggregate: str) -> TestTimePolicy:
    return TestTimePolicy(tta_transforms=transforms, tta_aggregate=aggregate, seed=space.seed)


def _label(policy: TestTimePolicy, ensemble: tuple[str, ...] = ()) -> str:
    parts = []
    if policy.tta_transforms:
        parts.append(f"tta[{','.join(policy.tta_transforms)}|{policy.tta_aggregate}]")
    if policy.ttt != "none" and policy.statistics == "memory":
        pace = f",prior{policy.stem_prior:g}/{policy.deep_prior:g}"
        parts.append(
            f"{policy.ttt}[memory{policy.memory_size}{pace}{'' if policy.continual else ',episodic'}]"
        )
    elif policy.ttt != "none":
        parts.append(f"{policy.ttt}x{policy.ttt_iterations}")
        if policy.bn_prior:
            parts.append(f"prior{policy.bn_prior:g}")
        if not policy.episodic:
            parts.append(f"stream{policy.momentum:g}")
    if policy.mc_dropout:
        parts.append(f"mc_dropout{policy.mc_dropout}")
    if ensemble:
        parts.append(f"ensemble[{len(ensemble) + 1} models]")
    return "+".join(parts) or "plain"


def describe_policy(policy: TestTimePolicy | None, ensemble: tuple[str, ...] = ()) -> str:
    """A short human-readable name for a policy (report tables)."""
    return _label(policy, ensemble) if policy is not None else "plain"


def ttt_policy(method: str, iterations: int | None, learning_rate: float | None) -> TestTimePolicy:
    """The adaptation the options name: bn with 1 iteration is the robust memory statistics; bn with more is
    that many passes of each batch's own statistics (continual, label-shift guarded); tent and sar take
    ``iterations`` gradient steps per batch at ``learning_rate`` on the memory statistics."""
    if method == "bn":
        if (iterations or 1) == 1:
            return ROBUST_BN[0]
        return TestTimePolicy(ttt="bn", statistics="batch", ttt_iterations=iterations)
    lr = {} if learning_rate is None else {"learning_rate": learning_rate}
    return TestTimePolicy(ttt=method, ttt_iterations=iterations or 1, **lr)


def _allows_base(space: PolicySearchSpace, policy: TestTimePolicy) -> bool:
    """Whether a base candidate keeps the fixed TTA and TTT settings (MC dropout and the ensemble come after)."""
    checks = {"tta": bool(policy.tta_transforms) == space.tta, "ttt": (policy.ttt != "none") == space.ttt}
    return all(ok for name, ok in checks.items() if name in space.fixed)
