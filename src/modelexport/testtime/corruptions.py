"""Image corruptions at stated severities (after Hendrycks & Dietterich, 2019), for robustness evaluation.

Inputs are NCHW float images in [0, 1]; outputs stay in [0, 1]. Noise is seeded. Severities run 1..5 and
their parameters are listed in ``SEVERITIES`` so reports can state exactly what was applied.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from .._registry import Registry
from ..errors import TestTimeError

__all__ = ["CORRUPTIONS", "SEVERITIES", "corrupt", "filter_matrix", "gaussian_blur", "gaussian_kernel"]

CorruptFn = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]

#: name -> fn(images, parameter, rng).
CORRUPTIONS: Registry[CorruptFn] = Registry(
    "corruption", error=TestTimeError, hint="choose the corruption from the list"
)

#: name -> parameter per severity 1..5 (noise std, contrast factor, blur sigma in pixels). Contrast and blur:
#: the CIFAR-10-C values, meant for small images (the ImageNet-C ones erase an 8x8 digit entirely). Noise:
#: the ImageNet-C standard deviations -- CIFAR-10-C's (0.04-0.10) cost the digits CNN about one point, too
#: little to measure what adaptation recovers.
SEVERITIES: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "blur": (0.4, 0.6, 0.7, 0.8, 1.0),
}


def corrupt(images: np.ndarray, name: str, severity: int, seed: int = 0) -> np.ndarray:
    """Apply corruption ``name`` at ``severity`` (1..5) to NCHW images in [0, 1]."""
    fn = CORRUPTIONS.get(name)
    if not 1 <= severity <= len(SEVERITIES[name]):
        raise TestTimeError(f"severity must be 1..{len(SEVERITIES[name])}, got {severity}")
    out = fn(
        np.asarray(images, dtype=np.float32), SEVERITIES[name][severity - 1], np.random.default_rng(seed)
    )
    return np.clip(out, 0.0, 1.0).astype(np.float32)


@CORRUPTIONS.register("gaussian_noise")
def _noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return x + rng.normal(0.0, sigma, x.shape)


@CORRUPTIONS.register("contrast")
def _contrast(x: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    mean = x.mean(axis=(-2, -1), keepdims=True)
    return (x - mean) * factor + mean


@lru_cache(maxsize=64)
def gaussian_kernel(sigma: float) -> tuple[float, ...]:
    """The normalised 1-D Gaussian of ``sigma`` pixels, radius 3 sigma (at least 1); cached, as the filter
    matrices are (a batch-1 stream denoises every example)."""
    radius = max(1, int(np.ceil(3 * sigma)))
    t = np.arange(-radius, radius + 1)
    k = np.exp(-(t**2) / (2 * sigma**2))
    return tuple((k / k.sum()).tolist())


@lru_cache(maxsize=64)
def filter_matrix(n: int, kernel: tuple[float, ...], mode: str) -> np.ndarray:
    """(n, n) float32 matrix that correlates a length-``n`` axis with ``kernel`` (odd length), the axis padded
    by ``np.pad``'s ``mode``: a separable 2-D filter of images ``x`` (..., H, W) is ``A @ x @ B.T``, two
    matrix products where shifted sums cost a numpy call per tap (a batch of one 8x8 digit: 90 -> 20 us)."""
    radius = len(kernel) // 2
    source = np.pad(np.arange(n), radius, mode=mode)  # padded position -> the position it copies
    out = np.zeros((n, n), np.float64)
    for t, weight in enumerate(kernel):
        np.add.at(out, (np.arange(n), source[t : t + n]), weight)
    return out.astype(np.float32)


def gaussian_blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of the last two axes (reflect padding, radius 3 sigma), float32."""
    h, w = x.shape[-2:]
    kernel = gaussian_kernel(sigma)
    return (
        filter_matrix(h, kernel, "reflect")
        @ x.astype(np.float32, copy=False)
        @ filter_matrix(w, kernel, "reflect").T
    )


@CORRUPTIONS.register("blur")
def _blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return gaussian_blur(x, sigma)
