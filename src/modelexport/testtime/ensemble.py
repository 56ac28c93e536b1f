"""Ensembles: several ONNX models fed the same inputs, their probabilities merged by an aggregator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import TestTimeError
from .aggregate import AGGREGATORS, aggregate
from .engine import TestTimeEngine
from .policy import TestTimePolicy

__all__ = ["Ensemble", "merge_probabilities"]


class Ensemble:
    """Average (``mean``, ``geometric_mean``...) or vote (``vote``) over member models; each may have its own policy."""

    def __init__(
        self,
        models: Sequence[Any],
        aggregate: str = "mean",
        policy: TestTimePolicy | None = None,
        providers: list[str] | tuple[str, ...] | None = None,
    ) -> None:
        if len(models) < 2:
            raise TestTimeError(f"an ensemble needs at least two models, got {len(models)}")
        AGGREGATORS.get(aggregate)
        self.aggregate = aggregate
        self.members = [
            m if isinstance(m, TestTimeEngine) else TestTimeEngine(m, policy, providers) for m in models
        ]

    def member_probs(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Each member's probabilities, stacked (M, N, C)."""
        probs = [m.predict(feeds) for m in self.members]
        shapes = {p.shape for p in probs}
        if len(shapes) > 1:
            raise TestTimeError(f"ensemble members disagree on the output shape: {sorted(shapes)}")
        return np.stack(probs)

    def predict(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Merged probabilities (N, C); log-probabilities are the aggregators' logits, so ``mean`` averages probabilities."""
        return merge_probabilities(self.member_probs(feeds), self.aggregate)


def merge_probabilities(probs: Sequence[np.ndarray] | np.ndarray, how: str = "mean") -> np.ndarray:
    """Members' probabilities (M, N, C) merged into (N, C) by an aggregator (``mean`` averages probabilities)."""
    stacked = np.stack(list(probs))
    return aggregate(np.log(np.clip(stacked, 1e-12, 1.0)), how, -1)
