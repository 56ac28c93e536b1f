"""Source anchors: a few of the source's own images per class, recorded with the model, against which a stream
measures how far noise moved its deep BN layers' variances and means.

Why. Where noise reaches the deep layers, their variances move with it, and exact BatchNorm over the whole
noisy test set follows them: on the image pipeline's digits networks, holding the stem at the test set's own
statistics and the deep layers at the source's left noise 4 at 0.84-0.86 accuracy where the test set's deep
variances gave 0.90-0.91 (seeds 11, 12, 25). A class-ordered stream cannot read them off its memory: a deep
layer's variance is class-specific, the memory holds one or two classes for the first batches, and following it
lost noise-4 streams 1-5 points. So those layers kept the source's variances, and the first classes of a noisy
stream read class by class paid for it (seed 12, noise 4: class 0 68% against 90% under the whole set's
statistics).

On those networks what noise does to a deep layer's variance is nearly the same for every class. The stream's
examples' within-class variance over that of the anchors of the same (predicted) classes, both measured under the
stream's statistics and taken as the median over the layer's channels, is a class-neutral ratio; times
the variance of all the anchors under those statistics it estimates the whole data's deep variance. From one batch
of one class it predicted the whole noisy test set as well as the set's own exact statistics did (seeds 12 and 25,
noise 4: 0.898 and 0.908 against 0.893 and 0.905). The anchors must be measured under the stream's statistics: the
same ratio applied to the source's variances lost 8 points, since the adapted stem changes what the deep layers see
of any image.

The measured variances replace the source's as the deep layers' prior
(``memory.StatisticsPrior.with_deep_moments``), as far as the stream's inputs were noisy beyond what the source's
were (``NOISE_OPEN``): a shift the denoising leaves in the deep layers. Clean, blurred and low-contrast streams
keep the source's prior (a contrast loss, which the stem normalises away, lost up to 2.3 points with it).

Noise moves the deep layers' means as well, and the same measurement reads how far: the anchors' mean under the
stream's statistics plus the mean difference between the stream's examples and the anchors of their predicted
classes (:meth:`AnchorComparison.means`). That shift is class-neutral only roughly: applied at the variances'
share on every measurement it cost seven digits networks 2.0 points of noise 4 on average (a later class paid for
the shift read off the first ones). So the means move by ``(1 - support) ** MEANS_FADE`` of that share
(:func:`means_fade`), the memory's class support when measured: fully while the memory holds one class, not at
all once it holds half its fair share of every class and its own deep means take over. On the thirty-nine digits
networks the image pipeline trained (the eight it was tried on, thirty-one others) class-ordered noise 3 at batch
1 went from 44-71% of its loss recovered to 56-78%, noise 4 from 36-61% to 40-66%; at batch 40 noise 3 from 47-78%
to 49-81%, noise 4 as it was. The fade first read the memory's class coverage, which a stray misprediction fills
on a noisy stream (one entry covers a class); by its support instead, noise 4 at batch 1 gained 0.2 points on
average both on those networks and on six held out (seeds 39-44), the rest within 0.1.

A first batch, measured on itself before it is predicted, kept the source's means at first: a shift read off the
very examples it then normalises swung single streams by up to 3 points either way. Its examples' classes were
predicted under the source's deep variances, though, the very statistics whose shift is measured, and a noisy
example's difference from the anchors of a wrong class reads as a shift. Read again in a second pass, with the
classes predicted under the deep variances the first reading measured, and moved half the variances' share
(``FIRST_MEANS``), noise 4 at batch 40 gained 0.8 points on average over every order (1.7 read class by class) on
forty-five digits networks, the nineteen the share was chosen on and twenty-six others.

A later measurement that runs the window's examples again (batches of 16 or more) moves the means ``k / (k +
MEANS_CLASSES)`` of what the support leaves (:func:`classes_share`), ``k`` the effective number of classes those
examples were predicted as: a shift read off one or two classes is theirs as much as the noise's, and the class
that streams in next paid for it (seed 35, noise 4 read as a folder: class 2 after 0 and 1 got 31 of 40 right, 37
with the source's deep means). Class-ordered noise 4 at batch 40 gained 0.5 points on average on the nineteen
digits networks the share was chosen on, 0.4 on twenty-six others; at batch 1, whose next example is nearly always
of the class just measured, it lost, and there the means move as before.

The estimate assumes noise moves a deep layer's variance alike for every class. It held on the image pipeline's
digits networks (twenty-nine of them: class-ordered noise 3 from 26-57% of its loss recovered to 47-66%) and not
on its shapes network (-1 to -1.7 points), so the pipeline records the anchors (``modelexport.source_anchors``)
beside the input-noise record only where class-ordered streams of its noisy validation images gain from them
(``engine.calibrate_anchors``); a model without them adapts as before.
"""

from __future__ import annotations

import base64
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .._numeric import count_entropy
from ..errors import TestTimeError

__all__ = [
    "FIRST_MEANS",
    "LONGEST",
    "MAX_VALUES",
    "MEANS_CLASSES",
    "MEANS_FADE",
    "MIN_EXAMPLES",
    "MIN_PER_CLASS",
    "NOISE_OPEN",
    "PER_CLASS",
    "WINDOW",
    "AnchorComparison",
    "ShiftWindow",
    "SourceAnchors",
    "classes_share",
    "means_fade",
]

#: Anchors the image pipeline records per class, and the most a measurement runs (an older record's first this
#: many of each class). The estimate's accuracy was the same with 16 and with 4: from 8 to 4, the final grid's
#: noisy streams on the thirty-nine digits networks moved by -0.04 to +0.00 points on average (each within
#: 1.7), and a measurement costs half (``LONGEST``).
PER_CLASS = 4
#: At most this many input values over all anchors (stored as float16): a model with large inputs keeps fewer
#: per class, and none below ``MIN_PER_CLASS`` (a within-class variance needs two).
MAX_VALUES = 2**20
MIN_PER_CLASS = 2
#: A stream measures its deep layers' shift on its last this many examples (``ShiftWindow``) ...
WINDOW = 128
#: ... again once it has seen as many examples since as it had then (at least the examples measured), at most this
#: many: the early measurements, while one or two classes have streamed by, are the ones that count (measured
#: again once the stream quadrupled instead, class-ordered noise 4 at batch 1 lost 0.24 points on average over
#: the pipeline's twenty-nine digits networks), and each costs a pass of the anchors (40 examples on the digits
#: networks: as long as 32 plain runs of one example there).
LONGEST = 1024
#: A stream's first measurement waits for this many examples (a stream's first batch of this many is measured
#: on itself, before it is predicted).
MIN_EXAMPLES = 32
#: The inputs' mean excess noise (``denoise.restore_measured``) at which the measured variances start to replace
#: the source's, fully at twice it: noise 2 reads 0.05, 3 0.09-0.10, 4 0.17-0.19 (the pipeline's digits
#: networks), clean and blurred images 0-0.01.
NOISE_OPEN = 0.05
#: Added to both variances of the within-class ratio (a dead channel has none).
RATIO_EPS = 1e-5
#: The deep means' measured shift counts ``(1 - support) ** MEANS_FADE`` of the variances' share (:func:`means_fade`),
#: the support being the memory's class support when measured: read off the window's one or two classes, the shift
#: is class-neutral only roughly, and the memory's own deep means take over as it comes to hold every class.
MEANS_FADE = 2
#: A measurement that runs the stream's last examples again (batches of ``streams.MIN_BATCH`` or more) moves the
#: deep means ``k / (k + MEANS_CLASSES)`` of what :func:`means_fade` gives, ``k`` the effective number of classes
#: those examples were predicted as (:func:`classes_share`): a shift read off one or two classes is theirs as much
#: as the noise's, and the class that streams in next pays for it.
MEANS_CLASSES = 2
#: A stream's first batch, measured on itself before it is predicted, moves its deep means this share of the
#: variances' share, read in a second pass under the variances it measured. At the full share single streams
#: swung by -5 to +4 points (nineteen digits networks; seed 35's class-ordered noise 4 47% -> 35%); at half,
#: noise 4 at batch 40 read class by class gained 1.7-1.8 points on average there, 1.7 over those and twenty-six others.
FIRST_MEANS = 0.5
#: The record's format.
ENCODING = "float16-base64"


@dataclass(frozen=True)
class SourceAnchors:
    """A package's ``modelexport.source_anchors``: ``x`` (N, ...) model inputs (float32) of a few source examples
    per class and their ``labels`` (N,)."""

    x: np.ndarray
    labels: np.ndarray

    @classmethod
    def select(
        cls,
        x: np.ndarray,
        labels: np.ndarray,
        per_class: int = PER_CLASS,
        max_values: int = MAX_VALUES,
        seed: int = 0,
    ) -> SourceAnchors | None:
        """Up to ``per_class`` examples of each class of ``labels`` with ``MIN_PER_CLASS`` or more (seeded),
        fewer where ``max_values`` asks; None where fewer than ``MIN_PER_CLASS`` a class fit, or no class has
        enough."""
        labels = np.asarray(labels, np.int64)
        if len(x) != len(labels):
            raise ValueError(f"{len(x)} examples with {len(labels)} labels")
        classes, counts = np.unique(labels, return_counts=True)
        classes = classes[counts >= MIN_PER_CLASS]
        size = int(np.prod(x.shape[1:]))
        k = min(per_class, max_values // max(1, size * len(classes))) if len(classes) else 0
        if k < MIN_PER_CLASS:
            return None
        rng = np.random.default_rng(seed)
        keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:k] for c in classes]))
        return cls(np.asarray(x[keep], np.float32), labels[keep])

    def first(self, per_class: int) -> SourceAnchors:
        """The first ``per_class`` anchors of each class (all of a class that has fewer), in record order."""
        keep = np.concatenate([np.flatnonzero(self.labels == c)[:per_class] for c in np.unique(self.labels)])
        if len(keep) == len(self.labels):
            return self
        keep.sort()
        return SourceAnchors(self.x[keep], self.labels[keep])

    def to_dict(self) -> dict[str, Any]:
        data = np.ascontiguousarray(self.x, "<f2").tobytes()
        return {
            "shape": list(self.x.shape),
            "labels": self.labels.tolist(),
            "encoding": ENCODING,
            "data": base64.b64encode(data).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SourceAnchors:
        """The record as ``to_dict`` wrote it; a malformed one is refused with the way around it."""
        try:
            shape = tuple(int(s) for s in data["shape"])
            labels = np.asarray(data["labels"], np.int64)
            if data.get("encoding") != ENCODING:
                raise ValueError(f"encoding {data.get('encoding')!r}, not {ENCODING!r}")
            raw = base64.b64decode(data["data"], validate=True)
            x = np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape)
            if labels.shape != (shape[0],) or not np.isfinite(x).all():
                raise ValueError(f"{labels.size} labels for {shape[0]} examples, or values not finite")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise TestTimeError(
                f"the model's modelexport.source_anchors record is malformed ({exc})",
                hint="re-run the image pipeline, or adapt without it: --no-anchors (anchors=False)",
            ) from None
        return cls(x, labels)


class ShiftWindow:
    """A stream's last ``size`` examples for its next measurement (``engine.TestTimeEngine._measure``), as
    its batches brought them: a batch's inputs (as adapted: restored), run with the anchors under the
    statistics of the moment, or, for a batch smaller than ``streams.MIN_BATCH``, the rows and predicted
    classes its own pass gave. Such a batch weighs little in its statistics (``engine._memory_state``), so
    its rows are those a measurement would give, and the measurement runs the anchors alone: at batch 1
    re-running the inputs made a noisy stream's first 200 examples cost 4.6x plain. Rows were measured
    under the prior of their time and are dropped at a measurement (:meth:`measured`); inputs are measured
    afresh each time."""

    def __init__(self, size: int = WINDOW) -> None:
        self.size = size
        self._batches: deque[_Batch] = deque()
        self._count = 0

    def __len__(self) -> int:
        return min(self._count, self.size)

    def push_inputs(self, x: np.ndarray) -> None:
        self._push(_Batch(len(x), x=x))

    def push_rows(self, rows: np.ndarray, classes: np.ndarray) -> None:
        self._push(_Batch(len(classes), rows=rows, classes=classes))

    def _push(self, batch: _Batch) -> None:
        self._batches.append(batch)
        self._count += batch.size
        while self._count - self._batches[0].size >= self.size:
            self._count -= self._batches.popleft().size

    def parts(self) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """The last ``size`` examples: (their inputs, their rows, the rows' classes), each None where there
        are none."""
        skip = max(0, self._count - self.size)  # the oldest batch's examples beyond the window
        inputs, rows, classes = [], [], []
        for batch in self._batches:
            if batch.x is not None:
                inputs.append(batch.x[skip:])
            if batch.rows is not None and batch.classes is not None:
                rows.append(batch.rows[skip:])
                classes.append(batch.classes[skip:])
            skip = 0
        return _joined(inputs), _joined(rows), _joined(classes)

    def measured(self) -> None:
        """Drop the rows: the next measurement's are to be measured under the prior this one gave."""
        self._batches = deque(batch for batch in self._batches if batch.x is not None)
        self._count = sum(batch.size for batch in self._batches)


@dataclass(frozen=True)
class _Batch:
    """One batch in a :class:`ShiftWindow`: its inputs, or its rows and predicted classes."""

    size: int
    x: np.ndarray | None = None
    rows: np.ndarray | None = None
    classes: np.ndarray | None = None


def _joined(parts: list[np.ndarray]) -> np.ndarray | None:
    return np.concatenate(parts) if parts else None


def _class_weights(classes: np.ndarray, anchor_labels: np.ndarray, least: int) -> dict[int, int]:
    """Predicted class -> its examples' count, for the classes with ``least`` examples and ``least`` anchors."""
    predicted = dict(zip(*np.unique(classes, return_counts=True), strict=True))
    held = dict(zip(*np.unique(anchor_labels, return_counts=True), strict=True))
    return {int(c): int(k) for c, k in predicted.items() if k >= least and held.get(c, 0) >= least}


def _within_variance(
    rows: np.ndarray, classes: np.ndarray, weights: dict[int, int], width: int
) -> np.ndarray:
    """The mean over ``weights``' classes (weighted) of each class's pooled variance of ``rows`` (per-example
    means, then mean squares, ``width`` channels each)."""
    total = np.zeros(width)
    for c, w in weights.items():
        moments = rows[classes == c].mean(axis=0)
        total += w * np.maximum(moments[width:] - moments[:width] ** 2, 0.0)
    return total / sum(weights.values())


@dataclass(frozen=True, eq=False)
class AnchorComparison:
    """A stream's examples beside the source anchors, both run under the same statistics: what the deep layers'
    (``layers``) variances and means are estimated from. ``rows``/``anchor_rows``: per-example BN statistics
    (N, 2 x width: means, then mean squares); ``classes``: the examples' predicted classes."""

    rows: np.ndarray
    classes: np.ndarray
    anchor_rows: np.ndarray
    anchor_labels: np.ndarray
    layers: list[slice]

    @property
    def width(self) -> int:
        return self.rows.shape[1] // 2

    @cached_property
    def _anchor_moments(self) -> np.ndarray:
        """The mean row of all the anchors (every class): read by both estimates."""
        return self.anchor_rows.mean(axis=0)

    def variances(self, base: np.ndarray) -> np.ndarray | None:
        """``base`` (variances over every BN channel) with each deep layer's replaced by the anchors' pooled
        variance times the median over its channels of the stream examples' within-class variance over the
        anchors' of the same classes (weighted by the examples' count; classes with two examples and two
        anchors). None where no class qualifies."""
        width = self.width
        weights = _class_weights(self.classes, self.anchor_labels, MIN_PER_CLASS)
        if not weights:
            return None
        stream = _within_variance(self.rows, self.classes, weights, width)
        anchors = _within_variance(self.anchor_rows, self.anchor_labels, weights, width)
        moments = self._anchor_moments
        pooled = np.maximum(moments[width:] - moments[:width] ** 2, 0.0)
        out = np.array(base, np.float64)
        for part in self.layers:
            ratio = np.median((stream[part] + RATIO_EPS) / (anchors[part] + RATIO_EPS))
            out[part] = pooled[part] * ratio
        return out

    def means(self, base: np.ndarray) -> np.ndarray | None:
        """``base`` (means over every BN channel) with each deep layer's replaced by the anchors' mean plus the
        stream examples' mean difference from the anchors of the same classes (weighted by the examples' count;
        classes with an example and an anchor). None where no class qualifies."""
        width, rows, classes = self.width, self.rows, self.classes
        weights = _class_weights(classes, self.anchor_labels, 1)
        if not weights:
            return None
        shift = np.zeros(width)
        for c, w in weights.items():
            held = self.anchor_rows[self.anchor_labels == c, :width]
            shift += w * (rows[classes == c, :width].mean(axis=0) - held.mean(axis=0))
        shift /= sum(weights.values())
        pooled = self._anchor_moments[:width]
        out = np.array(base, np.float64)
        for part in self.layers:
            out[part] = pooled[part] + shift[part]
        return out


def classes_share(classes: np.ndarray) -> float:
    """``k / (k + MEANS_CLASSES)``, ``k`` the effective number of classes among ``classes`` (predicted, ints >= 0):
    the exponential of their frequencies' entropy, 1 for one class and n for n equally frequent ones."""
    k = float(np.exp(count_entropy(np.bincount(classes))))
    return k / (k + MEANS_CLASSES)


def means_fade(support: float) -> float:
    """How much of the variances' share the measured deep means move by: ``(1 - support) ** MEANS_FADE``, the
    memory's class support (:attr:`~.memory.StatisticsMemory.support`) when measured."""
    return (1.0 - support) ** MEANS_FADE
