"""Input restoration for test-time adaptation: BN statistics cannot take noise out of an image, nor give a blurred
one its detail back; a filter can.

Normalisation statistics re-scale a noisy stem's features; they cannot remove the noise itself. On the image
pipeline's digits network, even exact BN statistics of i.i.d. batches recover 45% of the accuracy Gaussian noise
(severity 4) costs, a class-ordered stream 22%; the same statistics on inputs blurred by 0.5-0.6 pixel recover
51-57% (issue 25). So each example is first denoised by as much as its own noise calls for:

* **How noisy** (:func:`noise_ratio`): the noise's standard deviation, estimated from the low tail of the
  image's response to Immerkær's mask (the difference of two Laplacians, blind to locally planar image
  structure; J. Immerkær, "Fast noise variance estimation", 1996): the 10% quantile of its absolute value
  reads the flattest tenth of the image, where only noise answers; divided by the image's standard deviation,
  so that the ratio is blind to the model's normalisation and to a contrast change. One example, one channel:
  a class-sorted stream or a batch of one is measured like any other.
* **Against what** (:class:`InputNoise`): the level nine in ten of the source's training images stay under
  (``FLOOR_QUANTILE``; clean digits read 0.22 there, their rings and loops answer the mask too, blurred ones
  0.05-0.14, noisy ones 0.19-0.68), recorded by the image pipeline in its package (``modelexport.input_noise``).
  A model without the record is not denoised: textured photographs answer the mask without any noise, and
  only the source can say how much. Below the floor nothing moves, so clean and blurred images are left as
  they are (a floor at the median moved blurred digits and cost a network up to 0.7 points on them).
* **How much**: the example moves toward its Gaussian blur (``BLUR_SIGMA`` pixels) by
  ``min(1, strength * (ratio**2 - floor**2))``, the share of its variance that is noise above the source's,
  as a Wiener filter weighs noise against signal. Whether a blur helps is the network's own property: the
  image pipeline's networks, trained on resampled (jittered) images, gain from it, while a CNN trained on
  crisp digits lost 6 points of noisy accuracy with it (``tests/testtime/test_denoise.py``). So the strength
  is :func:`calibrate`-d on the source's held-out images with Gaussian noise added (``LEVELS``): the one of
  ``STRENGTHS`` with the best accuracy (the mildest on a tie), 0 (off) where no blur helps. It is judged
  where it runs, before adaptation (``engine.calibrate_restoration``): a blur also lowers an image's
  contrast, which plain predictions charge it for and adapted statistics take back; judged plain, the
  pipeline's digits networks got strengths of 4-8 where their class-ordered noise-4 streams gain up to 32.
* **Sharpening, the mirror image** (:func:`sharpness`, :func:`restore`): a blur takes the finest detail away,
  so an example whose detail (the mask's root mean square over its spread) falls below the level 99 in 100
  training images stay above (``SHARP_QUANTILE``; clean digits 0.64-0.80, blurred ones 0.34-0.74 at their
  median) gets an unsharp mask (``SHARPEN_SIGMA``) of the gain that brings it back to that level,
  ``sharp_floor / sharpness - 1`` (the first-order inverse of the blur's loss), times a strength calibrated the
  same way on the held-out images blurred (``BLURS``; at most 1, the gain itself). On the pipeline's seed-2
  digits network blur-4 recovery went 51-55% -> 71-75% and its class-ordered blur-2 streams came 0.1-0.7
  points closer to plain.
  A noisy example reads sharp and a blurred one noiseless, so the two corrections do not meet on one example.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TestTimeError
from .corruptions import filter_matrix, gaussian_blur

__all__ = [
    "BLURS",
    "BLUR_SIGMA",
    "FLOOR_QUANTILE",
    "LEVELS",
    "MAX_SHARPEN",
    "QUANTILE",
    "SHARPEN_SIGMA",
    "SHARPEN_STRENGTHS",
    "SHARP_QUANTILE",
    "STRENGTHS",
    "InputNoise",
    "calibrate",
    "denoise",
    "measurable",
    "noise_ratio",
    "noisy_levels",
    "restore",
    "restore_measured",
    "sharpen",
    "sharpness",
]

#: Share of an image's positions whose mask response is read: the flattest tenth.
QUANTILE = 0.1
#: The mask's response to unit white noise has standard deviation 6 (its weights' norm); the QUANTILE-th
#: quantile of a half-normal is Phi^-1((1 + QUANTILE) / 2) of it.
_HALF_NORMAL_Q10 = 0.12566134685507402
_SECOND_DIFFERENCE = (1.0, -2.0, 1.0)
#: The blur an example moves toward, in pixels (the oracle's best on the tuning network: 0.5-0.6).
BLUR_SIGMA = 0.6
#: Fewest pixels per side an image needs to be measured.
MIN_SIDE = 3
#: The share of the source's images whose noise ratio the floor lies above.
FLOOR_QUANTILE = 0.9
#: Calibration: the strengths tried, and the Gaussian noise added to the source's images (standard deviation
#: as a share of each image's own, clipped to the inputs' range as pixels clip), clean included.
STRENGTHS = (0.0, 2.0, 4.0, 8.0, 16.0, 32.0)
LEVELS = (0.0, 0.25, 0.5, 1.0)
#: Sharpening: the share of the source's images whose sharpness the sharpness floor lies below, the unsharp
#: mask's blur (pixels), and the calibration's strengths and Gaussian blurs (pixels; 0: clean).
SHARP_QUANTILE = 0.01
SHARPEN_SIGMA = 1.0
SHARPEN_STRENGTHS = (0.0, 0.5, 1.0)
#: The most an unsharp mask adds of an example's detail (a near-constant image reads a sharpness near 0).
MAX_SHARPEN = 4.0
BLURS = (0.0, 0.6, 1.0)


def _readings(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(noise ratio, sharpness), each (N, C), of ``x`` (N, C, H, W): one mask response serves both. Spelled
    out in ufunc reductions (``std``, ``mean`` and a masked ``divide`` cost several calls each): at batch size 1
    a stream restores every example, and the calls, not the pixels, are the cost."""
    n, c, h, w = x.shape
    x = x.astype(np.float32, copy=False)
    size = h * w
    # the mask is separable: the second difference [1, -2, 1] down the rows and across the columns
    response = (
        filter_matrix(h, _SECOND_DIFFERENCE, "edge") @ x @ filter_matrix(w, _SECOND_DIFFERENCE, "edge").T
    ).reshape(n, c, size)
    k = int(QUANTILE * size)
    sigma = np.partition(np.abs(response), k, axis=-1)[..., k] / (6 * _HALF_NORMAL_Q10)
    energy = np.sqrt(np.add.reduce(response * response, axis=-1) / size)
    flat = x.reshape(n, c, size)
    centred = flat - np.add.reduce(flat, axis=-1, keepdims=True) / size
    spread = np.sqrt(np.add.reduce(centred * centred, axis=-1) / size)
    measured = spread > 0  # a constant channel, or one with a non-finite value, reads 0
    spread = np.where(measured, spread, np.inf)
    return np.where(measured, sigma / spread, 0.0), np.where(measured, energy / spread, 0.0)


def noise_ratio(x: np.ndarray) -> np.ndarray:
    """(N, C) noise standard deviation over image standard deviation of each example's channel of ``x``
    (N, C, H, W): the QUANTILE-th quantile of Immerkær's mask response (edges replicated), scaled to a
    standard deviation for Gaussian noise. A constant channel has ratio 0."""
    return _readings(x)[0]


def sharpness(x: np.ndarray) -> np.ndarray:
    """(N, C) root mean square of Immerkær's mask response over the standard deviation of each example's
    channel of ``x`` (N, C, H, W): the share of its variance in the finest detail, which a blur takes away (clean
    digits 0.64 at their 1st percentile, blurred ones 0.34-0.74 at their median). A constant channel has 0."""
    return _readings(x)[1]


@dataclass(frozen=True)
class InputNoise:
    """A package's ``modelexport.input_noise``: the source data's noise ratio (the ``FLOOR_QUANTILE`` of
    :func:`noise_ratio` over ``examples`` of its images) and its sharpness (the ``SHARP_QUANTILE`` of
    :func:`sharpness`), with the denoising and sharpening strengths :func:`calibrate` chose."""

    floor: float
    strength: float
    examples: int
    #: The sharpness all but ``SHARP_QUANTILE`` of the source's images stay above, and the sharpening strength.
    sharp_floor: float = 0.0
    sharpen: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "strength": self.strength,
            "sharp_floor": self.sharp_floor,
            "sharpen": self.sharpen,
            "examples": self.examples,
            "estimator": "immerkaer-q10/std, rms/std",
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputNoise:
        """The record as ``to_dict`` wrote it; a malformed one is refused with the way around it."""
        try:
            record = cls(
                float(data["floor"]),
                float(data["strength"]),
                int(data.get("examples", 0)),
                float(data.get("sharp_floor", 0.0)),
                float(data.get("sharpen", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TestTimeError(
                f"the model's modelexport.input_noise record is malformed ({type(exc).__name__}: {exc})",
                hint="re-run the pipeline that wrote it, or turn it off (--denoise 0 --sharpen 0)",
            ) from exc
        values = (record.floor, record.strength, record.sharp_floor, record.sharpen)
        if not all(0 <= v < math.inf for v in values):
            raise TestTimeError(
                f"the model's modelexport.input_noise record is out of range: {data}",
                hint="re-run the pipeline that wrote it, or turn it off (--denoise 0 --sharpen 0)",
            )
        return record


def noisy_levels(images: np.ndarray, seed: int = 0) -> list[np.ndarray]:
    """``images`` (N, C, H, W) with Gaussian noise of each of ``LEVELS`` times each image's own spread added,
    clipped to the set's range per channel (seeded): the shifts calibration judges a restoration by."""
    rng = np.random.default_rng(seed)
    low, high = images.min(axis=(0, 2, 3), keepdims=True), images.max(axis=(0, 2, 3), keepdims=True)
    spread = images.std(axis=(1, 2, 3), keepdims=True)
    return [
        np.clip(images + level * spread * rng.standard_normal(images.shape), low, high).astype(np.float32)
        for level in LEVELS
    ]


def calibrate(
    train: np.ndarray,
    held_out: np.ndarray,
    labels: np.ndarray,
    predict: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
) -> InputNoise:
    """The record of a source: the floors measured on ``train`` images (N, C, H, W); the strengths chosen on
    ``held_out`` images and their ``labels`` through ``predict`` (a set of images -> class ids: the model as
    restored inputs meet it, adapted), the best mean accuracy over Gaussian noise of each of ``LEVELS`` added
    (denoising) and over each of ``BLURS`` (sharpening), the mildest strength on a tie."""
    floor = float(np.quantile(noise_ratio(train), FLOOR_QUANTILE))
    sharp_floor = float(np.quantile(sharpness(train), SHARP_QUANTILE))
    noisy = noisy_levels(held_out, seed)
    blurred = [held_out if sigma == 0 else gaussian_blur(held_out, sigma) for sigma in BLURS]

    def best(strengths: tuple[float, ...], score: Callable[[float], float]) -> float:
        return strengths[int(np.argmax([score(s) for s in strengths]))]  # the first of the best

    def mean_accuracy(images: list[np.ndarray], record: InputNoise) -> float:
        return float(np.mean([np.mean(predict(restore(x, record)) == labels) for x in images]))

    strength = best(STRENGTHS, lambda s: mean_accuracy(noisy, InputNoise(floor, s, 0)))
    sharpen = best(
        SHARPEN_STRENGTHS, lambda s: mean_accuracy(blurred, InputNoise(0.0, 0.0, 0, sharp_floor, s))
    )
    return InputNoise(floor, strength, len(train), sharp_floor, sharpen)


def measurable(shape: tuple[int, ...]) -> bool:
    """Whether inputs of ``shape`` are images :func:`noise_ratio` can read (N, C, H, W with H, W >= 3)."""
    return len(shape) == 4 and min(shape[-2:]) >= MIN_SIDE


def restore(x: np.ndarray, record: InputNoise) -> np.ndarray:
    """``x`` (N, C, H, W) with each example's channel, measured as given, moved toward its blur by
    ``record.strength`` times its squared noise ratio above the floor's square (at most all the way), and
    sharpened by an unsharp mask of ``record.sharpen`` times the gain that brings its detail back to the
    sharpness floor (``sharp_floor / sharpness - 1``, at most ``MAX_SHARPEN``); ``x`` itself when no example
    is noisier or smoother than the source's. A noisy example reads sharp and a blurred one noiseless, so the
    two corrections do not meet on one example (on the digits and shapes measured)."""
    return restore_measured(x, record)[0]


def restore_measured(
    x: np.ndarray, record: InputNoise, opened: Callable[[np.ndarray], float] | None = None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(:func:`restore`'s output, each example's *excess noise*, each example's *detail deficit*), the readings
    (N,) as given, averaged over its channels: the excess noise is its squared noise ratio above the floor's
    square (the share of its variance that is noise beyond the source's), None where the record denoises
    nothing; the detail deficit is the share of the sharpness floor's squared detail it lacks, ``1 -
    (sharpness / sharp_floor)^2`` above 0, None where the record sharpens nothing. What the restoration takes
    out of an example no statistics downstream can see any more; the adaptation reads it here
    (``memory.NOISE_GATE``, ``memory.BLUR_GATE``). ``opened``: given the examples' detail deficits, the share of
    the sharpening that runs (a stream's own gate, ``engine``); None: all of it."""
    out, excess, deficit = x, None, None
    if not (record.strength or (record.sharpen and record.sharp_floor)):
        return out, excess, deficit
    ratio, sharp = _readings(x)
    channels = ratio.shape[1]
    if record.strength:
        share = np.maximum(ratio * ratio - record.floor**2, 0.0)
        excess = np.add.reduce(share, axis=1) / channels
        weight = np.minimum(record.strength * share, 1.0)
        if weight.any():  # every example through the blur: a weight of 0 leaves it exactly as it was
            out = out + weight[:, :, None, None] * (gaussian_blur(x, BLUR_SIGMA) - x)
    if record.sharpen and record.sharp_floor:
        detail, read = sharp / record.sharp_floor, sharp > 0
        deficit = (
            np.add.reduce(np.where(read, np.maximum(1.0 - detail * detail, 0.0), 0.0), axis=1) / channels
        )
        strength = record.sharpen * (1.0 if opened is None else opened(deficit))
        if strength:
            gain = np.divide(record.sharp_floor, sharp, out=np.ones_like(sharp), where=read) - 1.0
            amount = np.minimum(np.maximum(strength * gain, 0.0), MAX_SHARPEN)
            if amount.any():
                out = out + amount[:, :, None, None] * (x - gaussian_blur(x, SHARPEN_SIGMA))
    return (out if out is x else out.astype(x.dtype, copy=False)), excess, deficit


def denoise(x: np.ndarray, floor: float, strength: float) -> np.ndarray:
    """:func:`restore` with denoising only."""
    return restore(x, InputNoise(floor, strength, 0))


def sharpen(x: np.ndarray, sharp_floor: float, strength: float) -> np.ndarray:
    """:func:`restore` with sharpening only."""
    return restore(x, InputNoise(0.0, 0.0, 0, sharp_floor, strength))
