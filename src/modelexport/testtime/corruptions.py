"""Image corruptions at stated severities (after Hendrycks & Dietterich, 2019), for robustness evaluation.

Inputs are NCHW float images in [0, 1]; outputs stay in [0, 1]. Noise is seeded. Severities run 1..5 and
their parameters are listed in ``SEVERITIES`` so reports can state exactly what was applied.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._registry import Registry
from ..errors import TestTimeError

__all__ = ["CORRUPTIONS", "SEVERITIES", "corrupt", "gaussian_blur"]

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


def gaussian_blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of the last two axes (reflect padding, radius 3 sigma)."""
    radius = max(1, int(np.ceil(3 * sigma)))
    t = np.arange(-radius, radius + 1)
    k = np.exp(-(t**2) / (2 * sigma**2))
    k /= k.sum()
    pad = [(0, 0)] * (x.ndim - 2) + [(radius, radius), (radius, radius)]
    p = np.pad(x, pad, mode="reflect")
    h, w = x.shape[-2:]
    rows = sum(k[i] * p[..., i : i + h, :] for i in range(len(k)))
    return sum(k[i] * rows[..., i : i + w] for i in range(len(k)))


@CORRUPTIONS.register("blur")
def _blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    return gaussian_blur(x, sigma)
