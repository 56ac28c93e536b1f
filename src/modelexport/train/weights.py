"""``TorchWeightOptimizer``: a DSPy teleprompter that trains the program's torch weights.

DSPy's own optimizers tune prompts and demos through an LM; ours has no LM and changes weights:
AdamW with warm-up then cosine (or linear) decay, the network's own training-time augmentation,
progress per epoch, early stopping on the validation metric as measured by ``dspy.Evaluate``, and
the best weights restored at the end.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import dspy
import numpy as np
from dspy.teleprompt import Teleprompter

from .._numeric import MAX_SEED, is_seed
from .._progress import progress_bar
from ..errors import ConfigError, TrainingError
from .program import ClassifierProgram, Metric, label_accuracy

__all__ = ["SCHEDULES", "TrainConfig", "TrainingSummary", "TorchWeightOptimizer", "evaluate_program"]

log = logging.getLogger(__name__)

#: Learning-rate decay after warm-up: progress in [0, 1] -> multiplier of the peak learning rate.
SCHEDULES: dict[str, Callable[[float], float]] = {
    "cosine": lambda t: 0.5 * (1.0 + math.cos(math.pi * t)),
    "linear": lambda t: 1.0 - t,
    "constant": lambda t: 1.0,
}


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings; ranges are checked before any training starts."""

    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    #: Decay after warm-up (``SCHEDULES``); it spans all ``epochs``, so early stopping cuts it short.
    schedule: str = "cosine"
    #: Epochs without a better validation score before stopping (ties count as better: later weights,
    #: trained longer at a lower learning rate, win; small validation sets tie often).
    patience: int = 8
    #: Apply the network's training-time augmentation (``Network.augment``) to training batches.
    augment: bool = True
    max_grad_norm: float = 1.0
    max_steps_per_epoch: int | None = None
    train_eval_limit: int = 2000
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        checks = [
            ("epochs", 1 <= self.epochs <= 1000, "between 1 and 1000"),
            ("batch_size", 1 <= self.batch_size <= 4096, "between 1 and 4096"),
            ("learning_rate", 0 < self.learning_rate <= 1, "in (0, 1]"),
            ("weight_decay", 0 <= self.weight_decay < 1, "in [0, 1)"),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1, "in [0, 1)"),
            ("schedule", self.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
            ("patience", self.patience >= 1, ">= 1"),
            ("max_grad_norm", self.max_grad_norm > 0, "> 0"),
            (
                "max_steps_per_epoch",
                self.max_steps_per_epoch is None or self.max_steps_per_epoch >= 1,
                ">= 1",
            ),
            ("train_eval_limit", self.train_eval_limit >= 1, ">= 1"),
            ("seed", is_seed(self.seed), f"an integer in [0, {MAX_SEED:,}]"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"{name} must be {valid}, got {getattr(self, name)!r}")


@dataclass
class TrainingSummary:
    """What training did (the report's ``training`` section plus the per-epoch history)."""

    train_accuracy: float
    val_accuracy: float | None
    epochs_run: int
    seconds: float
    best_epoch: int
    stopped_early: bool
    history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Run:
    """One compile's optimiser state: AdamW, its per-step scheduler, steps per epoch, the seeded generators."""

    optimizer: Any
    scheduler: Any
    steps: int
    rng: np.random.Generator  # shuffling
    generator: Any  # torch.Generator: augmentation


def evaluate_program(
    program: ClassifierProgram, devset: list[dspy.Example], metric: Metric, progress: bool = False
) -> float:
    """Score in [0, 1] with ``dspy.Evaluate`` (predictions batched up front, scored per example by DSPy)."""
    evaluator = dspy.Evaluate(
        devset=devset, metric=metric, num_threads=1, display_progress=progress, max_errors=1
    )
    with program.prefetched([ex[program.input_field] for ex in devset]):
        result = evaluator(program)
    return float(result.score) / 100.0


class TorchWeightOptimizer(Teleprompter):
    """Train ``student.network`` on ``trainset``; early-stop on ``metric`` over ``valset``; keep the best weights."""

    def __init__(self, config: TrainConfig | None = None, **options: Any) -> None:
        super().__init__()
        self.config = TrainConfig(**options) if config is None else config
        self.summary: TrainingSummary | None = None

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
        """Train in place and return ``student`` (copying a network's weights per candidate would be wasteful)."""
        if not isinstance(student, ClassifierProgram):
            raise TrainingError(
                f"TorchWeightOptimizer trains a ClassifierProgram, got {type(student).__name__}"
            )
        if not trainset:
            raise TrainingError("the training set is empty")
        inputs, targets = self._tensors(student, trainset)
        cfg = self.config
        started = time.perf_counter()
        run = self._run(student, len(inputs))
        history: list[dict[str, float]] = []
        best: tuple[float, int, dict[str, Any] | None] = (-math.inf, 0, None)
        for epoch in range(1, cfg.epochs + 1):
            loss = self._epoch(student, inputs, targets, run, epoch)
            row = {"epoch": float(epoch), "loss": loss}
            if valset:
                row["val_score"] = evaluate_program(student, valset, metric, progress=False)
            history.append(row)
            log.info("epoch %d: %s", epoch, ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "epoch"))
            score = row.get("val_score", -loss)
            if score >= best[0]:
                best = (score, epoch, copy.deepcopy(student.network.module.state_dict()))
            elif epoch - best[1] >= cfg.patience:
                log.info("early stop: no improvement for %d epoch(s)", cfg.patience)
                break
        if best[2] is not None:
            student.network.module.load_state_dict(best[2])
        self.summary = self._summary(
            student, trainset, valset, history, best[1], time.perf_counter() - started
        )
        student.training_summary = self.summary
        return student

    def _tensors(
        self, student: ClassifierProgram, trainset: list[dspy.Example]
    ) -> tuple[list[Any], np.ndarray]:
        field_name = student.input_field
        unknown = sorted({str(ex.label) for ex in trainset} - set(student.label2id))
        if unknown:
            raise TrainingError(
                f"labels {unknown[:5]} are not among the network's classes {student.label_names}"
            )
        missing = [i for i, ex in enumerate(trainset) if field_name not in ex]
        if missing:
            raise TrainingError(f"training example {missing[0]} has no {field_name!r} field")
        return [ex[field_name] for ex in trainset], np.asarray(
            [student.label2id[str(ex.label)] for ex in trainset]
        )

    def _run(self, student: ClassifierProgram, n: int) -> _Run:
        """AdamW, the warm-up + decay schedule per step, and the seeded shuffling/augmentation generators."""
        import torch

        cfg = self.config
        steps = math.ceil(n / cfg.batch_size)
        if cfg.max_steps_per_epoch:
            steps = min(steps, cfg.max_steps_per_epoch)
        total = steps * cfg.epochs
        warmup = int(total * cfg.warmup_ratio)
        decay = SCHEDULES[cfg.schedule]
        params = [p for p in student.network.module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, decay(min(1.0, (step - warmup) / max(1, total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        generator = torch.Generator().manual_seed(cfg.seed)
        return _Run(optimizer, scheduler, steps, np.random.default_rng(cfg.seed), generator)

    def _epoch(
        self, student: ClassifierProgram, inputs: list[Any], targets: np.ndarray, run: _Run, epoch: int
    ) -> float:
        import torch

        cfg, net = self.config, student.network
        order = run.rng.permutation(len(inputs))
        net.module.train()
        losses: list[float] = []
        bar = progress_bar(
            total=run.steps,
            desc=f"train epoch {epoch}/{cfg.epochs}",
            unit="batch",
            disable=not cfg.progress,
            leave=False,
        )
        with bar:
            for step in range(run.steps):
                idx = order[step * cfg.batch_size : (step + 1) * cfg.batch_size]
                feeds = net.encode([inputs[i] for i in idx])
                if cfg.augment:
                    feeds = net.augment(feeds, run.generator)
                loss = torch.nn.functional.cross_entropy(net.logits(feeds), torch.from_numpy(targets[idx]))
                if not torch.isfinite(loss):
                    raise TrainingError(
                        f"the loss became {loss.item()} at epoch {epoch}, step {step + 1}",
                        hint="lower --learning_rate",
                    )
                run.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.module.parameters(), cfg.max_grad_norm)
                run.optimizer.step()
                run.scheduler.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        net.module.eval()
        return float(np.mean(losses))

    def _summary(
        self,
        student: ClassifierProgram,
        trainset: list[dspy.Example],
        valset: list[dspy.Example] | None,
        history: list[dict[str, float]],
        best_epoch: int,
        seconds: float,
    ) -> TrainingSummary:
        rng = np.random.default_rng(self.config.seed)
        sample = [trainset[i] for i in rng.permutation(len(trainset))[: self.config.train_eval_limit]]
        return TrainingSummary(
            train_accuracy=student.accuracy(sample),
            val_accuracy=student.accuracy(valset) if valset else None,
            epochs_run=len(history),
            seconds=round(seconds, 2),
            best_epoch=best_epoch,
            stopped_early=len(history) < self.config.epochs,
            history=history,
        )
