"""Aggregators: merge K views' (or passes', or models') logits into one probability array.

Every aggregator takes logits stacked on axis 0, shape ``(K, N, ..., C)`` with classes on ``class_axis``
of one view (default: last), and returns probabilities ``(N, ..., C)`` that sum to one over the classes, so the
next step (argmax, confidence, a pipeline's labels) never has to know which aggregator ran.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._numeric import softmax
from .._registry import Registry
from ..errors import TestTimeError

__all__ = ["AGGREGATORS", "aggregate", "entropy"]

AggregateFn = Callable[[np.ndarray, int], np.ndarray]

#: name -> fn(logits (K, N, ..., C), class_axis) -> probabilities (N, ..., C).
AGGREGATORS: Registry[AggregateFn] = Registry(
    "TTA aggregator", error=TestTimeError, hint="choose the TTA aggregator from the list"
)


def entropy(probs: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats."""
    return -(probs * np.log(np.clip(probs, 1e-12, 1.0))).sum(axis=axis)


def _normalize(p: np.ndarray, axis: int) -> np.ndarray:
    return p / np.clip(p.sum(axis=axis, keepdims=True), 1e-12, None)


def aggregate(logits: np.ndarray, name: str = "mean", class_axis: int = -1) -> np.ndarray:
    """Merge stacked logits with the named aggregator (axis 0 is the view axis)."""
    axis = class_axis if class_axis < 0 else class_axis + 1
    return AGGREGATORS.get(name)(np.asarray(logits, dtype=np.float64), axis).astype(np.float32)


@AGGREGATORS.register("mean")
def _mean(logits: np.ndarray, axis: int) -> np.ndarray:
    """Mean of the probabilities (the usual TTA/ensemble average)."""
    return softmax(logits, axis).mean(axis=0)


@AGGREGATORS.register("mean_logits")
def _mean_logits(logits: np.ndarray, axis: int) -> np.ndarray:
    return softmax(logits.mean(axis=0), axis - 1 if axis > 0 else axis)


@AGGREGATORS.register("geometric_mean")
def _geometric(logits: np.ndarray, axis: int) -> np.ndarray:
    log_p = np.log(np.clip(softmax(logits, axis), 1e-12, 1.0))
    return _normalize(np.exp(log_p.mean(axis=0)), axis - 1 if axis > 0 else axis)


@AGGREGATORS.register("max")
def _max(logits: np.ndarray, axis: int) -> np.ndarray:
    """Per class, the most confident view (renormalized)."""
    return _normalize(softmax(logits, axis).max(axis=0), axis - 1 if axis > 0 else axis)


@AGGREGATORS.register("median")
def _median(logits: np.ndarray, axis: int) -> np.ndarray:
    """Per class median over views (robust to one bad view; renormalized)."""
    return _normalize(np.median(softmax(logits, axis), axis=0), axis - 1 if axis > 0 else axis)


@AGGREGATORS.register("vote")
def _vote(logits: np.ndarray, axis: int) -> np.ndarray:
    """Majority vote: the share of views voting for each class; ties go to the higher mean probability."""
    probs = softmax(logits, axis)
    k = logits.shape[0]
    votes = (probs == probs.max(axis=axis, keepdims=True)).astype(np.float64)
    share = votes.sum(axis=0) / k
    return _normalize(share + 1e-6 * probs.mean(axis=0), axis - 1 if axis > 0 else axis)


@AGGREGATORS.register("tsharpen")
def _tsharpen(logits: np.ndarray, axis: int, t: float = 0.5) -> np.ndarray:
    """Mean of probabilities raised to t=0.5, renormalized (softens over-confident views)."""
    return _normalize((softmax(logits, axis) ** t).mean(axis=0), axis - 1 if axis > 0 else axis)
