"""Stream orders and the stream guard: test-time adaptation measured on the streams it will really see.

Real streams are not i.i.d.: an image folder is read class by class, a camera sees one scene for minutes.
:class:`StreamOrder` reorders a labelled set the way such streams arrive (``as-is``, ``shuffle``, ``stratified``,
``class-sorted``, ``dirichlet:ALPHA`` -- the non-i.i.d. sampling of the test-time-adaptation benchmarks, small
alpha = long runs of one class), seeded.

:class:`CollapseGuard` watches the predictions of one stream, without labels, and says when a batch must be
served by the source model instead:

- *collapse*: the entropy of the adapted predicted-class histogram over the last ``window`` predictions falls
  below ``threshold`` (a fraction of ``log C``) and below the source model's on the same examples -- the stream
  is reset to the source;
- *label shift* (for methods whose BN statistics come from the batch itself: episodic, or continual without a
  running average): the recent predicted classes are not a sample of the stream's label distribution (a G-test
  at significance ``shift_alpha`` against the stream's longer-run histogram, uniform before any history).
  Such a batch holds one or two classes; its statistics describe those classes, not the shift, and normalising
  with them erases what tells the classes apart (the issue's 37-point loss on class-sorted batches).
  Batches under ``MIN_BATCH`` examples are never trusted with their own statistics.

:func:`prior_correction` is the label-shift correction of the outputs (ROID, Marsden et al. 2024): the
probabilities are reweighted by the label distribution of the last ``PRIOR_WINDOW`` predictions, smoothed
towards uniform the less evidence there is.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from .._numeric import MAX_SEED, count_entropy, is_seed
from .._registry import Registry
from ..errors import TestTimeError
from .anchors import ShiftWindow
from .memory import StatisticsMemory, StatisticsPrior
from .tail import TailBuffer

__all__ = [
    "MIN_BATCH",
    "ORDERS",
    "PRIOR_WINDOW",
    "CollapseGuard",
    "LabelHistory",
    "Stream",
    "StreamOrder",
    "chi2_critical",
    "label_shift_statistic",
    "prior_correction",
    "stream_order",
]

#: Fewest examples whose own BN statistics are trusted (smaller batches of batch-statistics methods: source).
MIN_BATCH = 16
#: Recent predictions the label-shift test and the prior correction look at (at least the batch).
SHIFT_WINDOW = 64
PRIOR_WINDOW = 64
#: The lazy collapse check's longest interval, in quarter windows (after repeated checks found no collapse).
MAX_BACKOFF = 8
#: Predictions the stream's label distribution is estimated from (the label-shift test's reference).
MARGINAL_WINDOW = 512
#: Significance of the G-test by which a memory-statistics stream counts as label-correlated (LabelHistory).
CORRELATION_ALPHA = 0.001

ORDER_HINT = (
    "--order takes as-is, shuffle, stratified, class-sorted or dirichlet:ALPHA (ALPHA > 0), seeded by --seed"
)

OrderFn = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]

#: name -> fn(labels, alpha, rng) -> permutation of ``range(len(labels))``.
ORDERS: Registry[OrderFn] = Registry(
    "stream order", error=TestTimeError, hint="choose the stream order from the list"
)


@ORDERS.register("as-is")
def _as_is(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    return np.arange(len(labels))


@ORDERS.register("shuffle")
def _shuffle(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(len(labels))


@ORDERS.register("stratified")
def _stratified(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Shuffled, yet every stretch of the stream holds each class in its share (stratified batches)."""
    position = np.empty(len(labels))
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        position[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.argsort(position, kind="stable")


@ORDERS.register("class-sorted")
def _class_sorted(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """All examples of one class, then the next (shuffled within a class): an image folder read in order."""
    return np.concatenate([rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)])


@ORDERS.register("dirichlet")
def _dirichlet(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Each class's examples spread over time slots by Dirichlet(alpha) proportions, slots played in order."""
    classes = np.unique(labels)
    slots: list[list[int]] = [[] for _ in range(max(2, len(classes)))]
    for c in classes:
        members = rng.permutation(np.flatnonzero(labels == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(len(slots), alpha)))[:-1] * len(members)).astype(int)
        for slot, part in zip(slots, np.split(members, cuts), strict=True):
            slot.extend(part.tolist())
    return np.concatenate([rng.permutation(np.asarray(s, dtype=np.int64)) for s in slots if s])


@dataclass(frozen=True)
class StreamOrder:
    """The order a labelled set is streamed in: ``as-is``, ``shuffle``, ``class-sorted``, ``dirichlet:ALPHA``."""

    kind: str = "as-is"
    alpha: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        ORDERS.get(self.kind)
        if self.kind == "dirichlet" and not 0 < self.alpha < math.inf:
            raise TestTimeError(
                f"dirichlet alpha must be a finite number > 0, got {self.alpha}", hint=ORDER_HINT
            )
        if not is_seed(self.seed):
            raise TestTimeError(
                f"seed must be an integer in [0, {MAX_SEED:,}], got {self.seed!r}", hint=ORDER_HINT
            )

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> StreamOrder:
        """``"dirichlet:0.1"`` -> StreamOrder("dirichlet", 0.1); other names take no parameter."""
        name, _, arg = spec.strip().partition(":")
        if not arg:
            return cls(name, seed=seed)
        if name != "dirichlet":
            raise TestTimeError(
                f"stream order {name!r} takes no parameter (only dirichlet:ALPHA does)", hint=ORDER_HINT
            )
        try:
            alpha = float(arg)
        except ValueError:
            raise TestTimeError(f"dirichlet alpha must be a number, got {arg!r}", hint=ORDER_HINT) from None
        return cls(name, alpha, seed)

    def __str__(self) -> str:
        return f"dirichlet:{self.alpha:g}" if self.kind == "dirichlet" else self.kind

    def indices(self, labels: np.ndarray | list[int]) -> np.ndarray:
        """The permutation of the examples (seeded); labels are needed by the class-aware orders."""
        y = np.asarray(labels, dtype=np.int64)
        order = ORDERS.get(self.kind)(y, self.alpha, np.random.default_rng(self.seed))
        assert len(order) == len(y)
        return order


def stream_order(spec: str | StreamOrder, seed: int = 0) -> StreamOrder:
    return spec if isinstance(spec, StreamOrder) else StreamOrder.parse(spec, seed)


def _entropy(classes: list[int], num_classes: int) -> float:
    return count_entropy(np.bincount(np.asarray(classes, dtype=np.int64), minlength=num_classes))


@functools.lru_cache(maxsize=64)
def chi2_critical(dof: int, alpha: float) -> float:
    """The chi-square quantile ``1 - alpha`` with ``dof`` degrees of freedom, without scipy: exact for 1 and 2
    (two classes, three), Wilson-Hilferty above (within 2% for alpha in [0.001, 0.05], 1% from 9 dof)."""
    if dof == 1:
        return NormalDist().inv_cdf(1.0 - alpha / 2.0) ** 2
    if dof == 2:
        return float(-2.0 * np.log(alpha))
    z = NormalDist().inv_cdf(1.0 - alpha)
    h = 2.0 / (9.0 * dof)
    return float(dof * (1.0 - h + z * np.sqrt(h)) ** 3)


def label_shift_statistic(
    recent: list[int] | np.ndarray, history: list[int] | np.ndarray, num_classes: int
) -> float:
    """G statistic (likelihood ratio, ~ chi2(C-1) when ``recent`` is an i.i.d. sample of the stream) of the
    recent predicted classes against the history's class frequencies, add-one smoothed: uniform before any
    history, so a stream is assumed balanced until it shows otherwise."""
    counts = np.bincount(np.asarray(recent, dtype=np.int64), minlength=num_classes)
    return _g_statistic(counts, np.bincount(np.asarray(history, dtype=np.int64), minlength=num_classes))


def _g_statistic(counts: np.ndarray, past: np.ndarray) -> float:
    """:func:`label_shift_statistic` from the two windows' class counts, in Python scalars: for a dozen classes
    that costs half of what a dozen numpy calls do (a memory-statistics stream asks at each refresh)."""
    recent, history = counts.tolist(), past.tolist()
    scale = sum(recent) / (sum(history) + len(history))
    return 2.0 * sum(k * math.log(k / (scale * (h + 1.0))) for k, h in zip(recent, history, strict=True) if k)


def prior_correction(probs: np.ndarray, recent: np.ndarray) -> np.ndarray:
    """``probs`` (N, C) reweighted by the label distribution of ``recent`` (M, C) probabilities (ROID's prior
    correction): ``p(y|x) * prior(y)``, the prior smoothed towards uniform by ``max(1/M, 1/C) / max(prior)``
    -- weak evidence (few examples, a flat prior) changes little. One example (M = 1) never changes the
    arg max."""
    prior = recent.mean(axis=0)
    m, c = recent.shape
    smooth = max(1.0 / m, 1.0 / c) / float(prior.max())
    out = probs * ((prior + smooth) / (1.0 + smooth * c))
    return (out / out.sum(axis=-1, keepdims=True)).astype(probs.dtype)


def _ring_slots(pushed: int, count: int, size: int) -> slice | np.ndarray:
    """Where the last ``min(count, size)`` of ``count`` new entries go in a ring of ``size`` slots that has
    taken ``pushed`` before them: one stretch as a slice (no index array), else the wrapped positions."""
    kept = min(count, size)
    start = (pushed + count - kept) % size
    return slice(start, start + kept) if start + kept <= size else (start + np.arange(kept)) % size


class ClassRing:
    """The last ``size`` predicted classes of a stream, a ring (-1: a slot never written); one batch is written
    as one slice where it fits. The classes are counted only when asked (:meth:`counts`): a batch costs a copy."""

    def __init__(self, size: int) -> None:
        self.ring = np.full(size, -1, np.int64)
        self.pushed = 0

    def push(self, classes: np.ndarray) -> None:
        size = len(self.ring)
        if len(classes) == 1:  # one example at a time: no array views (batch 1 is per-call bound)
            self.ring[self.pushed % size] = classes[0]
            self.pushed += 1
            return
        self.ring[_ring_slots(self.pushed, len(classes), size)] = np.asarray(classes, np.int64)[-size:]
        self.pushed += len(classes)

    def counts(self, num_classes: int) -> np.ndarray:
        """How many of each class the ring holds (its first ``min(pushed, size)`` slots hold them all)."""
        return np.bincount(self.ring[: min(self.pushed, len(self.ring))], minlength=num_classes)

    def clear(self) -> None:
        self.ring[:] = -1
        self.pushed = 0


class ClassWindow(ClassRing):
    """The collapse check's window of the last ``size`` predicted classes; :meth:`due` is True once full and
    then every quarter window (the entropy is looked at that often, not per example)."""

    def __init__(self, size: int, num_classes: int) -> None:
        super().__init__(size)
        self.num_classes = num_classes
        self.since = 0
        #: Checks come this many quarter windows apart (doubled after each check that found no collapse).
        self.backoff = 1

    def push(self, classes: np.ndarray) -> None:
        super().push(classes)
        self.since += len(classes)

    def due(self) -> bool:
        if self.pushed < len(self.ring) or self.since < max(1, len(self.ring) // 4) * self.backoff:
            return False
        self.since = 0
        return True

    def entropy(self) -> float:
        return count_entropy(self.counts(self.num_classes))

    def clear(self) -> None:
        super().clear()
        self.since = 0


class LabelHistory(ClassRing):
    """The last ``SHIFT_WINDOW + MARGINAL_WINDOW`` predicted classes of a memory-statistics stream.

    :meth:`correlated`: whether the stream's labels arrive correlated in time -- the last ``SHIFT_WINDOW``
    predictions fail the G-test against the ``MARGINAL_WINDOW`` before them (uniform before any), the
    label-shift test of :class:`CollapseGuard`. A class-ordered stream does (its recent predictions are one
    or two classes); an i.i.d. one does not, even where a corruption makes its predictions uneven or
    collapsed -- the case a memory's class support must not be mistaken for (``memory.py``)."""

    def __init__(self) -> None:
        super().__init__(SHIFT_WINDOW + MARGINAL_WINDOW)

    def correlated(self, num_classes: int, alpha: float = CORRELATION_ALPHA) -> bool:
        """The G-test of the last ``SHIFT_WINDOW`` predictions against those before them at ``alpha``."""
        n = min(self.pushed, len(self.ring))
        if num_classes < 2 or n == 0:
            return False
        end = self.pushed % len(self.ring)  # where the next class goes: the ring ends just before it
        recent = min(n, SHIFT_WINDOW)
        counts = np.bincount(self._span(end - recent, end), minlength=num_classes)
        return _g_statistic(counts, self.counts(num_classes) - counts) > chi2_critical(num_classes - 1, alpha)

    def _span(self, start: int, stop: int) -> np.ndarray:
        """The classes at ring positions ``start`` .. ``stop`` (``start`` may be negative: wrapped)."""
        if start >= 0:
            return self.ring[start:stop]
        if stop <= 0:
            return self.ring[start : stop or None]
        return np.concatenate([self.ring[start:], self.ring[:stop]])


@dataclass
class CollapseGuard:
    """The predicted classes of a stream, adapted and source; says when a batch must be served by the source.

    Collapsed: the adapted predictions' entropy over the last ``window`` is below ``threshold * log C`` (0
    disables that check) *and* below the source model's on the same examples -- a reset helps only when the
    source spreads its predictions wider (a corruption can collapse the source model itself; resetting to it
    then loses the adaptation and gains nothing). 0.2 means about ``C ** 0.2`` classes or fewer over the
    window, far below what a class-sorted stream of a working model shows over a window spanning a few classes.

    Label shift (``shift_alpha`` > 0, checked only for batch-statistics methods): the last ``max(n,
    SHIFT_WINDOW)`` adapted predictions fail the G-test against the ``MARGINAL_WINDOW`` before them at
    significance ``shift_alpha``, the statistic scaled to ``SHIFT_WINDOW`` predictions for larger batches.
    Measured on digits (batches of 64): i.i.d. batches score G <= 23, class-sorted and Dirichlet(0.1) ones
    23-170; the 0.001 critical value is 27.9. Exact BN on an i.i.d. batch of 128 blurred digits scores 35
    unscaled (its predictions are uneven, not label-shifted), 17.5 scaled.
    """

    threshold: float = 0.2
    window: int = 256
    shift_alpha: float = 0.001
    #: Episodic methods do not change on a reset: their windows are kept, every collapsed batch falls back.
    episodic: bool = False
    adapted: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    #: The lazy check's adapted predictions of the batches whose source predictions are in ``source``.
    paired: list[int] = field(default_factory=list)
    #: The lazy check's window of adapted predictions.
    recent: ClassWindow | None = None
    #: The adapted predictions of the last MARGINAL_WINDOW examples (never cleared: the label history).
    history: list[int] = field(default_factory=list)
    resets: int = 0

    def check(
        self, adapted: np.ndarray, source: np.ndarray, num_classes: int, batch_statistics: bool = True
    ) -> str | None:
        """Record one batch's predicted classes; ``"collapse"`` (continual: the windows are cleared, the stream
        is to be reset), ``"label shift"`` or None (serve the adaptation)."""
        if num_classes < 2:
            return None
        new = [int(c) for c in np.asarray(adapted).reshape(-1)]
        shifted = False
        if self.shift_alpha > 0 and batch_statistics:
            recent = (self.history + new)[-max(len(new), SHIFT_WINDOW) :]
            past = self.history[: max(0, len(self.history) - (len(recent) - len(new)))]
            # scaled to SHIFT_WINDOW predictions: an effect size, not significance that grows with the batch
            # (a biased model's i.i.d. batch of 450 is "significantly" uneven, yet not label-shifted)
            g = label_shift_statistic(recent, past, num_classes) * min(1.0, SHIFT_WINDOW / len(recent))
            shifted = g > chi2_critical(num_classes - 1, self.shift_alpha)
        self.history = (self.history + new)[-MARGINAL_WINDOW:]
        if self._collapsed(new, source, num_classes):
            return "collapse"
        return "label shift" if shifted else None

    def suspects(self, adapted: np.ndarray, num_classes: int) -> bool:
        """The lazy form of the collapse check (no source run per batch): records the adapted predictions and
        says whether the source model's predictions of this batch are needed -- the last ``window`` adapted
        predictions (checked every quarter window) are narrower than ``threshold * log C``, or a suspicion is
        being judged (:meth:`judge`)."""
        if self.threshold <= 0 or num_classes < 2:
            return False
        if self.recent is None or self.recent.num_classes != num_classes:
            self.recent = ClassWindow(self.window, num_classes)
        self.recent.push(adapted)
        if self.source:
            return True
        if not self.recent.due():
            return False
        return self.recent.entropy() < self.threshold * np.log(num_classes)

    def judge(self, adapted: np.ndarray, source: np.ndarray, num_classes: int) -> bool | None:
        """A suspected batch's adapted and source predictions: None while fewer than ``min(window,
        SHIFT_WINDOW)`` source predictions are in, then True (collapsed: narrower than the source on the same
        examples) or False. Either verdict clears the windows: the next check comes ``window`` predictions on."""
        self.paired = self.paired + [int(c) for c in np.asarray(adapted).reshape(-1)]
        self.source = self.source + [int(c) for c in np.asarray(source).reshape(-1)]
        if len(self.source) < min(self.window, SHIFT_WINDOW):
            return None
        collapsed = _entropy(self.paired, num_classes) < _entropy(self.source, num_classes)
        self.paired, self.source = [], []
        if self.recent is not None:
            self.recent.clear()
            # a source as narrow as the adaptation (a corruption that collapses the model itself) is a
            # property of the data: look again less often, up to MAX_BACKOFF quarter windows apart
            self.recent.backoff = 1 if collapsed else min(2 * self.recent.backoff, MAX_BACKOFF)
        if collapsed and not self.episodic:
            self.resets += 1
        return collapsed

    def _collapsed(self, adapted: list[int], source: np.ndarray, num_classes: int) -> bool:
        if self.threshold <= 0:
            return False
        self.adapted = (self.adapted + adapted)[-self.window :]
        self.source = (self.source + [int(c) for c in np.asarray(source).reshape(-1)])[-self.window :]
        if len(self.adapted) < self.window:
            return False
        h = _entropy(self.adapted, num_classes)
        if h >= self.threshold * np.log(num_classes) or h >= _entropy(self.source, num_classes):
            return False
        if not self.episodic:  # the stream is reset: judge the new adaptation afresh
            self.adapted.clear()
            self.source.clear()
            self.resets += 1
        return True


@dataclass
class Stream:
    """One stream's adaptation state (continual policies), scratch memory, guard and recent outputs."""

    #: The adapted BN state (None: the source).
    state: dict[str, Any] | None = None
    batches: int = 0
    #: Examples adapted on since the last reset (the running statistics' count).
    seen: int = 0
    #: Method scratch (the redundancy filter's moving average).
    memory: dict[str, np.ndarray] = field(default_factory=dict)
    #: The class-balanced memory of recent examples' BN statistics (``statistics="memory"``).
    bank: StatisticsMemory | None = None
    #: A gradient method's tail inputs since its last step (``tail.py``).
    tail: TailBuffer | None = None
    #: The blended statistics last computed: (memory clock, batch size, affine parameters, state).
    statistics: tuple[int, int, Any, dict[str, np.ndarray]] | None = None
    #: The last examples adapted on, for the next measurement against the source anchors (``anchors.py``).
    window: ShiftWindow | None = None
    #: The memory clock at which the stream measures its shift again, and the source prior with the deep
    #: variances its noise measured against the anchors (None: not measured yet; the engine's prior).
    prior: tuple[int, StatisticsPrior] | None = None
    guard: CollapseGuard | None = None
    #: The predicted classes of a memory-statistics stream (kept on a reset: the stream's label history).
    labels: LabelHistory | None = None
    #: Collapse-guard resets to the source so far.
    resets: int = 0
    #: Batches the guard served with the source model (collapse, label shift, too small for its statistics).
    fallbacks: int = 0
    #: The last PRIOR_WINDOW served probabilities (the prior correction's label distribution; kept on reset).
    recent_probs: np.ndarray | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        """Back to the source model: no adapted state, no memory."""
        self.state, self.memory, self.seen, self.bank, self.tail = None, {}, 0, None, None
        self.statistics, self.window, self.prior = None, None, None
