"""Small numeric helpers shared by every layer (probabilities from logits)."""

from __future__ import annotations

import numpy as np

__all__ = ["softmax"]


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Probabilities over ``axis``; the max is subtracted first so large logits do not overflow."""
    e = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
