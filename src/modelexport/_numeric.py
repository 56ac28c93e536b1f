"""Small numeric helpers shared by every layer (probabilities from logits, memory estimates)."""

from __future__ import annotations

import math
import os

import numpy as np

from .errors import ModelExportError

__all__ = [
    "MAX_SEED",
    "log_softmax",
    "softmax",
    "available_memory",
    "check_fits_in_memory",
    "count_entropy",
    "is_seed",
    "tensor_bytes",
]

#: Largest random seed: numpy's generators take 0 <= seed < 2**32 (torch's take the same range here).
MAX_SEED = 2**32 - 1


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Probabilities over ``axis``; the max is subtracted first so large logits do not overflow."""
    e = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log-probabilities over ``axis`` in float64 (the max subtracted first, as :func:`softmax`)."""
    z = logits.astype(np.float64) - logits.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


#: Classes up to which :func:`count_entropy` works in Python scalars: a dozen numpy calls on a few values cost
#: more than a loop over them (the collapse guard asks every quarter window of a stream).
SCALAR_CLASSES = 32


def count_entropy(counts: np.ndarray) -> float:
    """The entropy (nats) of the distribution that ``counts`` (one per class, not all 0) give."""
    if len(counts) <= SCALAR_CLASSES:
        values = counts.tolist()
        total = sum(values)
        return -sum(k / total * math.log(k / total) for k in values if k)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable, else free pages); None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed every generator we seed accepts (an int in [0, MAX_SEED])."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def tensor_bytes(shape: tuple[int, ...] | list[int], itemsize: int) -> int:
    """Bytes of a dense tensor (Python ints: no overflow for absurd shapes)."""
    return math.prod(int(d) for d in shape) * itemsize


def check_fits_in_memory(nbytes: int, what: str, error: type[ModelExportError]) -> None:
    """Refuse, before allocating, ``nbytes`` that exceed the memory available now (the numbers in the message)."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise error(
            f"{what} needs {nbytes:,} bytes ({nbytes / 2**30:,.1f} GiB), more than the "
            f"{free:,} bytes ({free / 2**30:,.1f} GiB) of memory available",
            hint="use a smaller shape or batch size",
        )
