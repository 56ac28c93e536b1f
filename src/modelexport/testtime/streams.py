"""Stream orders and the collapse guard: test-time adaptation measured on the streams it will really see.

Real streams are not i.i.d.: an image folder is read class by class, a camera sees one scene for minutes.
:class:`StreamOrder` reorders a labelled set the way such streams arrive (``as-is``, ``shuffle``, ``stratified``,
``class-sorted``, ``dirichlet:ALPHA`` -- the non-i.i.d. sampling of the test-time-adaptation benchmarks, small
alpha = long runs of one class), seeded. :class:`CollapseGuard` watches the predictions of one stream: when the
entropy of the predicted-class histogram over the last ``window`` predictions falls below ``threshold`` (a
fraction of ``log C``), the adaptation has collapsed onto few classes and the stream is reset to the source.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TestTimeError
from .registry import Registry

__all__ = ["ORDERS", "CollapseGuard", "Stream", "StreamOrder", "stream_order"]

OrderFn = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]

#: name -> fn(labels, alpha, rng) -> permutation of ``range(len(labels))``.
ORDERS: Registry[OrderFn] = Registry("stream order")


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
        if self.kind == "dirichlet" and not self.alpha > 0:
            raise TestTimeError(f"dirichlet alpha must be > 0, got {self.alpha}")

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> StreamOrder:
        """``"dirichlet:0.1"`` -> StreamOrder("dirichlet", 0.1); other names take no parameter."""
        name, _, arg = spec.strip().partition(":")
        if not arg:
            return cls(name, seed=seed)
        if name != "dirichlet":
            raise TestTimeError(f"stream order {name!r} takes no parameter (only dirichlet:ALPHA does)")
        try:
            alpha = float(arg)
        except ValueError:
            raise TestTimeError(f"dirichlet alpha must be a number, got {arg!r}") from None
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
    counts = np.bincount(np.asarray(classes, dtype=np.int64), minlength=num_classes).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@dataclass
class CollapseGuard:
    """Predicted-class histograms of a stream's last ``window`` predictions, adapted and source; trips on
    collapse.

    Collapsed: the adapted predictions' entropy is below ``threshold * log C`` (0 disables the guard) *and*
    below the source model's on the same examples -- a reset helps only when the source spreads its
    predictions wider (a corruption can collapse the source model itself; resetting to it then loses the
    adaptation and gains nothing). 0.2 means about ``C ** 0.2`` classes or fewer over the window, far below
    what a class-sorted stream of a working model shows over a window spanning a few classes.
    """

    threshold: float = 0.2
    window: int = 256
    adapted: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    resets: int = 0

    def observe(self, adapted: np.ndarray, source: np.ndarray, num_classes: int) -> bool:
        """Record one batch's predicted classes; True when the stream has collapsed (the window is cleared)."""
        if self.threshold <= 0 or num_classes < 2:
            return False
        for recent, new in ((self.adapted, adapted), (self.source, source)):
            recent.extend(int(c) for c in np.asarray(new).reshape(-1))
            del recent[: max(0, len(recent) - self.window)]
        if len(self.adapted) < self.window:
            return False
        h = _entropy(self.adapted, num_classes)
        if h >= self.threshold * np.log(num_classes) or h >= _entropy(self.source, num_classes):
            return False
        self.adapted.clear()
        self.source.clear()
        self.resets += 1
        return True


@dataclass
class Stream:
    """One stream's adaptation state (continual policies), scratch memory and collapse guard."""

    #: The adapted BN state (None: the source).
    state: dict[str, Any] | None = None
    batches: int = 0
    #: Examples adapted on since the last reset (the running statistics' count).
    seen: int = 0
    #: Method scratch (the redundancy filter's moving average).
    memory: dict[str, np.ndarray] = field(default_factory=dict)
    guard: CollapseGuard | None = None
    #: Collapse-guard resets to the source so far.
    resets: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        """Back to the source model: no adapted state, no memory."""
        self.state, self.memory, self.seen = None, {}, 0
