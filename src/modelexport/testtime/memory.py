"""Robust BatchNorm statistics for real streams: a class-balanced memory of recent examples' statistics.

Exact test-batch statistics describe a class-sorted batch (one or two classes) or a single example, not the
data; normalising with them erases what tells the classes apart. Following RoTTA (Yuan et al. 2023: robust BN
with a category-balanced memory bank) and NOTE (Gong et al. 2022: prediction-balanced reservoir sampling), each
stream keeps a :class:`StatisticsMemory` of the BN-input statistics of recent examples (per example, per
channel: mean and mean square at every BN layer, read from the same ONNX Runtime pass that predicts), balanced
by predicted class: when it is full, a new example replaces the oldest one of the most represented class, so
the examples of earlier classes stay while one class streams by. Its moments are the pooled statistics of the
examples it holds.

Which layers may follow them how fast (:class:`StatisticsPrior`): the *stem* BN layers (those with no BN
upstream: they see the image through one convolution, low-level statistics that a corruption moves and a
class barely does) mix the source statistics (``stem_prior`` pseudo-examples), the memory and the current
batch itself (on a class-ordered stream only as far as the stem sees a shift, below); deeper layers
(class-specific features) mix the source (``deep_prior`` pseudo-examples) with the memory only, so a
class-sorted batch never normalises its own deep features. Measured on corrupted digits
(``benchmarks/test_time.py``): adapting deep layers from the batch costs up to 8 points on class-sorted noisy
data; this split keeps every stream order of the test networks at or above the source model. It did not on
the image pipeline's own network, whose stem layer tells classes apart (stem statistics alone, even the exact
ones of the whole test set, cost it 1.4 points on clean digits): there a stem adapting while a class-sorted
stream still holds the deep layers back fell up to 2.8 points below plain on clean data at batch size 1.

Hence the *shift gate* (``gate``, :meth:`StatisticsPrior.gates`): the stem layers' variances adapt only once the
memory's variances are more than ``gate`` nats a channel (the variance part of the Gaussians' KL divergence) from
the source's, fully from twice that; their means always follow. On that network the stem means cost nothing and
the stem variances all of the 1.4 points; a contrast or blur shift moves the variances by 0.12-1.1 nats, clean
data by 0.005-0.07 (the tuning networks). A stream's first batch has no memory to measure on; with the gates
open there, a class-ordered stream's first batch, one class, normalised its class away in the stem's variances
(the batch counts ``n / (n + stem_prior)`` of them: 71% at 40). It reads its own shift instead
(:meth:`StatisticsPrior.first_gates`), without the excess noise below: a shift the stem cannot see is no
reason to follow one batch's stem variances. The same reading sets how far a class-ordered stream's batch of
``streams.MIN_BATCH`` or more (its labels correlated in time, ``streams.LabelHistory``) counts in the stem: a
run of one class beside a full memory still set 22% of the stem's statistics at batch 40 and normalised its
class's signature away, so where the stem sees no shift (clean data, or noise the restoration took out) the
memory and the source set it alone. Gaussian noise 4 read class by class gained 0.9 points on the pipeline's
digits networks; contrast, which the stem sees, kept what it had.

What the deep layers trust: the memory's class *coverage* counts the classes it holds, and a class-sorted
stream's stray predictions inflated it -- the balanced memory keeps a class's one or two mispredicted entries
for good, so a memory of four true classes counted nine (the seed-0 pipeline network, clean digits read class
by class), and the deep layers followed a skewed memory. On a stream whose labels arrive correlated in time
(``streams.LabelHistory``) and where no shift is measured (the stem's gate shut), a class therefore counts
only by its *support*, the share of ``SUPPORT`` times its fair share of the memory it holds
(:attr:`StatisticsMemory.support`). A measured shift (the gate open) restores the plain count, because a
severe shift makes predictions collapse onto few classes and the deep layers must follow it (contrast 5 on the
tests' digits CNN recovered 36-51% with the count, 5-36% with the support alone); so does an i.i.d. stream,
whose uneven predictions under a corruption leave few-entry classes too (the support on every stream cost the
tests' shapes CNN up to 17 points of noise-4 recovery).

The gates also read what the stem cannot see any more. Where the engine denoises its inputs first
(``denoise.py``), the stem's statistics of a noisy stream look clean: Gaussian noise 4 on the pipeline's
digits networks left every gate shut, and with it the support count, and class-ordered batches of 40
recovered 39-46% of the loss (the tuning networks, seeds 0 and 2). Each entry therefore keeps its input's
*excess noise* as given (``denoise.restore_measured``: the share of its variance that is noise beyond the
source's), and the gates open as the entries' mean rises from ``NOISE_GATE`` to twice that, whichever of the
two readings is more open (there: 48-58%; severity 2, which reads 0.05, unchanged).

How much the deep layers trust a class-ordered stream at all: with no shift measured, what a memory of
correlated examples differs from the source by is mostly *which* examples of which classes it keeps (a class's
entries are the last of its run), and following it cost the pipeline's held-out digits networks up to 1.5
points on mildly noisy digits read as a folder is read. There the deep layers' source counts ``SHUT_PRIOR``
times (the coverage divided by its square root), back to once as the gate opens -- or as the entries' *detail
deficit* (``denoise.restore_measured``: the share of the source's finest detail an input lacked before the
sharpening gave it back) rises from ``BLUR_GATE`` to twice that: a blur the sharpening hid from the stem is a
shift the deep layers must still follow (blur 4 class-ordered fell from 66% to 49% of its loss recovered on a
held-out network without it). The deficit opens nothing else: the plain count on a sharpened blur cost the
tuning network seed 2 6-9 points of class-ordered blur-4 recovery. Only where the entries carry those
readings (the engine restores its inputs with the source's record) does a shut gate mean no shift: on the
tests' networks, which carry none, the stronger source cost shapes noise 4 class-sorted 65% -> 33% of its loss
recovered, so a memory without readings keeps the source's own strength. Where they do, it holds in any order:
on an i.i.d. stream that measures no shift what the memory differs by is its examples' noise (shuffled blur-2
digits, which cost plain half a point, fell up to a point below plain following it).

Where the model records a few of its source's images (``anchors.py``), a noisy stream replaces the deep layers'
source variances in this prior with the anchors' measured under its own statistics, scaled by how its examples
differ from the anchors of their classes, and moves their means by how far its examples lie from those anchors
while its memory holds few classes (:meth:`StatisticsPrior.with_deep_moments`).

The memory holds 128 examples by default and the source counts as 16 of them in stem layers, 64 in deeper
ones: the ratios of the first design (64 / 8 / 32) with half the estimation noise of 64 examples' statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "BLUR_GATE",
    "NOISE_GATE",
    "SHUT_PRIOR",
    "SUPPORT",
    "StatisticsMemory",
    "StatisticsPrior",
    "balanced_keep",
    "opening",
]

#: Weight vectors cached (per memory size and coverage, a float: unbounded) before the cache is emptied.
MAX_WEIGHTS = 256
#: Added to both variances of :meth:`StatisticsPrior.shift` (a dead channel has none).
SHIFT_EPS = 1e-5
#: A class counts as covered by the memory once it holds this share of its fair share (capacity / classes):
#: half of it, 6 of 128 entries over 10 classes (a stray misprediction counts a sixth of a class).
SUPPORT = 0.5
#: The entries' mean excess noise (``denoise.restore_measured``: the share of an image's variance that is noise
#: beyond the source's) at which the gates start to open, fully at twice that: a stream of digits with Gaussian
#: noise of severity 2 reads 0.05, 3 0.09-0.10, 4 0.17-0.19 (the pipeline's networks), clean and blurred ones 0-0.01.
NOISE_GATE = 0.1
#: The same for the entries' mean detail deficit (``denoise.restore_measured``: the share of the source's squared
#: detail an image lacks), the blur the sharpening takes out of the stem's sight: digits blurred at severity 2 read
#: 0.19-0.25, 3 0.56-0.62, 4 0.78-0.81, clean and noisy ones 0-0.01 (the pipeline's tuning networks).
BLUR_GATE = 0.3
#: How many times the deep layers' source prior counts while nothing measures a shift on a stream of restored
#: inputs (the gate shut, no detail deficit), in any order: with no shift, what the memory's deep statistics
#: differ from the source by is mostly which examples of which classes it keeps (class-ordered) or their noise
#: (i.i.d.); back to once as the gate or the deficit opens.
SHUT_PRIOR = 4.0
#: Classes present up to which the memory's quota is computed with Python scalars.
SMALL_CLASSES = 32


def opening(reading: float, threshold: float) -> float:
    """How open a gate is at ``reading``: shut up to ``threshold``, rising linearly to fully open at twice it."""
    return min(1.0, max(0.0, reading / threshold - 1.0))


def _answer(correlated: bool | Callable[[], bool]) -> bool:
    """Whether the stream's labels arrive correlated (:meth:`StatisticsPrior.coverage`: a callable is asked here,
    only where the answer matters)."""
    return correlated() if callable(correlated) else correlated


def _by_support(count: float, support: float, gate: float) -> float:
    """A correlated stream's class count: its memory's ``support`` while the gate is shut, back to ``count`` as
    the gate opens (interpolated), never above ``count``."""
    return min(count, support if gate <= 0.0 else gate * count + (1.0 - gate) * support)


def _water_level(sizes: list[int], capacity: int) -> list[int]:
    """Each class's share of ``capacity`` slots: classes with fewer entries keep all, the rest an equal level
    (the slots left over by rounding go to the largest classes)."""
    if sum(sizes) <= capacity:
        return list(sizes)
    present = len(sizes) - sizes.count(0)
    if present <= SMALL_CLASSES:  # a few classes: Python scalars cost less than numpy calls
        return _water_level_small(sizes, capacity)
    counts = np.asarray(sizes, np.int64)
    ranked = np.sort(counts)
    before = np.concatenate([[0], np.cumsum(ranked)[:-1]])
    shares = (capacity - before) // (len(ranked) - np.arange(len(ranked)))
    level = int(shares[np.argmax(ranked > shares)])  # the first class that does not fit whole
    quota = np.minimum(counts, level)
    extra = capacity - int(quota.sum())
    over = np.flatnonzero(counts > level)
    quota[over[np.argsort(-counts[over], kind="stable")[:extra]]] += 1
    return quota.tolist()


def _water_level_small(sizes: list[int], capacity: int) -> list[int]:
    """:func:`_water_level` over the present classes one by one (the same quota, tested): (size, class)
    pairs sort as the classes by size with ties in class order."""
    ranked = sorted((k, c) for c, k in enumerate(sizes) if k)
    left, present = capacity, len(ranked)
    quota = list(sizes)
    for i, (k, _) in enumerate(ranked):
        share = left // (present - i)
        if k > share:  # this class and every larger one get the level; the largest first take what is left
            extra = left - share * (present - i)
            for j, (_, c) in enumerate(sorted((-size, c) for size, c in ranked[i:])):
                quota[c] = share + (j < extra)
            break
        left -= k
    return quota


def balanced_keep(classes: np.ndarray, ages: np.ndarray, capacity: int) -> np.ndarray:
    """Indices (sorted) of the entries a class-balanced memory of ``capacity`` keeps: each class its
    water-filling share, the newest (largest age) of each class. ``classes`` are ints >= 0."""
    counts = np.bincount(classes)
    quota = np.asarray(_water_level(counts.tolist(), capacity), np.int64)
    order = np.lexsort((-ages, classes))  # by class, newest first
    by_class = classes[order]
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(order)) - starts[by_class]
    return np.sort(order[rank < quota[by_class]])


def _newest(classes: np.ndarray, counts: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """Indices (sorted) of the last ``taken[c]`` examples of each class ``c`` in ``classes`` (``counts``: their
    bincount)."""
    backwards = classes[::-1]
    order = np.argsort(backwards, kind="stable")
    rank = np.empty(len(classes), np.int64)
    rank[order] = np.arange(len(classes)) - (np.cumsum(counts) - counts)[backwards[order]]
    return (len(classes) - 1 - np.flatnonzero(rank < taken[backwards]))[::-1]


@dataclass
class StatisticsMemory:
    """Per-example statistics rows (``width`` values each) of up to ``capacity`` recent examples, balanced by
    predicted class. One per stream; not thread-safe (the stream's lock guards it)."""

    capacity: int
    width: int
    #: Classes the keys come from (the model's outputs; 1 for a non-classifier: one key).
    num_classes: int = 1
    stats: np.ndarray = field(init=False, repr=False)
    classes: np.ndarray = field(init=False, repr=False)
    #: Each entry's excess noise and detail deficit as its input was given (``denoise.restore_measured``; 0
    #: where unmeasured).
    noise: np.ndarray = field(init=False, repr=False)
    deficit: np.ndarray = field(init=False, repr=False)
    ages: np.ndarray = field(init=False, repr=False)
    size: int = 0
    #: Whether its examples came with readings of what the input restoration took out (the engine has the
    #: source's record): only then does a shut gate mean no shift (:meth:`StatisticsPrior.coverage`).
    measured: bool = False
    #: Examples ever added (the age of the newest).
    clock: int = 0
    #: Distinct classes among the entries.
    distinct: int = 0
    #: Class -> its entries' slots, oldest first.
    _slots: dict[int, list[int]] = field(init=False, repr=False)
    #: Entries per class (None: to be counted; one example at a time does not keep it).
    _counts: list[int] | None = field(init=False, repr=False, default=None)
    #: :meth:`moments` since the last change.
    _moments: np.ndarray | None = field(init=False, repr=False, default=None)
    #: Ones over the capacity: :meth:`moments` sums the entries as one matrix-vector product.
    _ones: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stats = np.zeros((self.capacity, self.width))
        self.classes = np.zeros(self.capacity, np.int64)
        self.noise = np.zeros(self.capacity)
        self.deficit = np.zeros(self.capacity)
        self.ages = np.zeros(self.capacity, np.int64)
        self._ones = np.ones(self.capacity)
        self._slots = {}
        self._counts = [0] * max(1, self.num_classes)

    def add(
        self,
        stats: np.ndarray,
        classes: np.ndarray,
        noise: np.ndarray | None = None,
        deficit: np.ndarray | None = None,
    ) -> None:
        """Add examples' rows (N, width) with their predicted classes (N,), excess noise and detail deficit
        (N,; None: 0, and the memory not ``measured`` by them): what :func:`balanced_keep` keeps of the entries
        and the new examples, found per class (each class's oldest entries are the ones dropped), so a full
        memory costs O(new rows + classes) per batch, not a sort of its capacity."""
        n = len(classes)
        # a memory never measured holds zeros there: an unmeasured batch need not write them
        write_noise, write_deficit = self.measured or noise is not None, self.measured or deficit is not None
        self.measured = self.measured or noise is not None or deficit is not None
        if n == 1:  # one example at a time (batch 1): Python scalars, no index arrays
            one = (
                stats[0],
                int(classes[0]),
                0.0 if noise is None else float(noise[0]),
                0.0 if deficit is None else float(deficit[0]),
            )
            if self.size == self.capacity:
                self._replace_one(*one)
            else:
                self._append_one(*one)
            return
        self._moments = None
        new, rows = np.asarray(classes, np.int64), np.asarray(stats)
        first = self.clock + 1
        self.clock += n
        if self._counts is None:
            self._counts = np.bincount(self.classes[: self.size], minlength=self.num_classes).tolist()
        added = np.bincount(new, minlength=len(self._counts)).tolist()
        counts = self._cover(len(added))
        sizes = [c + a for c, a in zip(counts, added, strict=True)]
        slots: slice | np.ndarray
        # the new examples kept (a slice: all of them, the common case, with no copies)
        kept_new: slice | np.ndarray
        if self.size + n <= self.capacity:  # room for every example: nothing is dropped
            quota, kept_new, kept = sizes, slice(None), n
            slots = slice(self.size, self.size + n)
        else:
            quota = _water_level(sizes, self.capacity)
            dropped_slots: list[int] = []
            every = True  # every new example is kept
            for c, (k, a, q) in enumerate(zip(counts, added, quota, strict=True)):
                if a > q:  # the class keeps only its newest q
                    every, a = False, q
                k -= q - a  # the oldest entries dropped
                if k:
                    queue = self._slots[c]
                    dropped_slots += queue[:k]
                    if len(queue) == k:
                        del self._slots[c]
                    else:
                        del queue[:k]
            if every:
                kept_new, kept = slice(None), n
            else:
                taken = np.minimum(added, quota)
                kept_new = _newest(new, np.asarray(added), taken)
                kept = len(kept_new)
            # new rows that are kept go to the slots of dropped entries (in slot order), then to free ones
            dropped_slots.sort()
            dropped = np.asarray(dropped_slots, np.int64)
            slots = (
                dropped
                if kept == len(dropped)
                else np.concatenate([dropped, np.arange(self.size, self.size + kept - len(dropped))])
            )
        kept_classes = new[kept_new]
        self.stats[slots], self.classes[slots] = rows[kept_new], kept_classes
        self.ages[slots] = np.arange(first, first + n)[kept_new]
        if write_noise:
            self.noise[slots] = 0.0 if noise is None else np.asarray(noise, np.float64)[kept_new]
        if write_deficit:
            self.deficit[slots] = 0.0 if deficit is None else np.asarray(deficit, np.float64)[kept_new]
        queues = self._slots
        find = queues.get
        indices = range(slots.start, slots.stop) if isinstance(slots, slice) else slots.tolist()
        for c, j in zip(kept_classes.tolist(), indices, strict=True):  # ages rise: oldest first
            queue = find(c)
            if queue is None:
                queues[c] = [j]
            else:
                queue.append(j)
        self._counts = quota
        self.size = min(self.capacity, self.size + kept)  # full once anything was dropped
        self.distinct = len(queues)

    def _cover(self, classes: int) -> list[int]:
        """The per-class counts, for at least ``classes`` classes (a class beyond the model's counts from 0)."""
        counts = self._counts
        assert counts is not None
        if classes > len(counts):
            counts += [0] * (classes - len(counts))
        return counts

    def _append_one(self, row: np.ndarray, label: int, noise: float, deficit: float) -> None:
        """A memory with room takes one example into its next free slot."""
        self._moments = None
        j = self.size
        queue = self._slots.get(label)
        if queue is None:
            self._slots[label] = [j]
        else:
            queue.append(j)
        if self._counts is not None:
            self._cover(label + 1)
            self._counts[label] += 1
        self.distinct = len(self._slots)
        self.clock += 1
        self.size += 1
        self.stats[j], self.classes[j], self.ages[j] = row, label, self.clock
        self.noise[j], self.deficit[j] = noise, deficit

    def _replace_one(self, row: np.ndarray, label: int, noise: float, deficit: float) -> None:
        """A full memory takes one example: it replaces the oldest entry of its own class when that class is
        among the most represented, else the oldest entry of the most represented classes."""
        self._moments = None
        slots = self._slots
        largest = max(map(len, slots.values()))
        own = slots.get(label)
        if own is not None and len(own) == largest:
            victim = label
        else:  # the most represented class whose oldest entry is oldest
            victim = min((self.ages[q[0]], c) for c, q in slots.items() if len(q) == largest)[1]
        queue = slots[victim]
        j = queue.pop(0)
        if not queue:
            del slots[victim]
        slots.setdefault(label, []).append(j)
        self._counts = None  # counted again by the next batch
        self.distinct = len(slots)
        self.clock += 1
        self.stats[j], self.classes[j], self.ages[j] = row, label, self.clock
        self.noise[j], self.deficit[j] = noise, deficit

    def moments(self) -> np.ndarray:
        """The mean row over the entries (zeros when empty); read-only, computed once per change (the shift
        gate and the blend both read it) as a matrix-vector product with ones: in a stream that costs about
        half of what keeping a running sum does per batch, or ``sum(axis=0)``."""
        if self._moments is None:
            size = self.size
            moments = self._ones[:size] @ self.stats[:size] / size if size else np.zeros(self.width)
            moments.flags.writeable = False
            self._moments = moments
        return self._moments

    @property
    def noise_level(self) -> float:
        """The entries' mean excess noise (0 when empty or unmeasured)."""
        return float(self.noise[: self.size].sum() / self.size) if self.size and self.measured else 0.0

    @property
    def deficit_level(self) -> float:
        """The entries' mean detail deficit (0 when empty or unmeasured)."""
        return float(self.deficit[: self.size].sum() / self.size) if self.size and self.measured else 0.0

    @property
    def coverage(self) -> float:
        """The share of the classes a full memory could hold that it holds: 1 once it covers
        ``min(num_classes, capacity)`` classes."""
        return min(1.0, self.distinct / min(self.num_classes, self.capacity)) if self.size else 0.0

    @property
    def support(self) -> float:
        """The coverage with each class counted by how much of it the memory holds: ``min(1, entries /
        (SUPPORT * capacity / num_classes))`` summed over the classes, over the classes a full memory could
        hold (1 once every class has half its fair share; a stray entry of a class adds a sixth of one at
        128 entries over 10 classes)."""
        if not self.size:
            return 0.0
        fair = SUPPORT * self.capacity / max(1, self.num_classes)
        held = sum(min(1.0, len(q) / fair) for q in self._slots.values())
        return min(1.0, held / min(self.num_classes, self.capacity))


class StatisticsPrior:
    """The source BN statistics as vectors over every BN channel (layers in graph order), each channel's
    strength in pseudo-examples, and which channels are deep; :meth:`blend` mixes them with a memory.

    ``gated``: the channels of the layers whose variances wait for a measured shift (the stem layers), and
    ``gate``: the shift, in nats a channel, at which they start to follow (0: no gate; :meth:`gates`)."""

    def __init__(
        self,
        mean: np.ndarray,
        var: np.ndarray,
        strength: np.ndarray,
        deep: np.ndarray,
        gated: list[slice] | None = None,
        gate: float = 0.0,
    ) -> None:
        self.mean, self.var, self.strength = mean, var, strength
        #: Means, then mean squares: the moments a memory keeps.
        self.moments = np.concatenate([mean, var + mean * mean])
        self._strength = np.concatenate([strength, strength])
        self._deep = np.concatenate([deep, deep])
        self._weights: dict[tuple[int, int], np.ndarray] = {}
        self.gated, self.gate = list(gated or []) if gate > 0 else [], gate
        self._gated_var = [var[part] + SHIFT_EPS for part in self.gated]
        #: Each gated layer's mean squares in a memory row (after the means of every channel).
        self._gated_squares = [slice(len(mean) + p.start, len(mean) + p.stop) for p in self.gated]

    def with_deep_moments(
        self, var: np.ndarray, share: float, mean: np.ndarray | None = None, mean_share: float = 0.0
    ) -> StatisticsPrior:
        """A copy whose deep channels' variances moved ``share`` of the way to ``var`` and means ``mean_share``
        of the way to ``mean`` (over every channel; a stream's measured shift, ``anchors.py``); the strengths,
        stem and gates stay."""
        deep = self._deep[: len(self.mean)]
        moved = np.where(deep, self.var + share * (var - self.var), self.var)
        means = self.mean
        if mean is not None:
            means = np.where(deep, self.mean + mean_share * (mean - self.mean), self.mean)
        return StatisticsPrior(means, moved, self.strength, deep, self.gated, self.gate)

    def shift(self, memory: StatisticsMemory | np.ndarray) -> list[float]:
        """Per gated layer: how far the pooled variances of a memory (or of rows of examples' statistics, N x
        width) are from the source's, the mean over the layer's channels of the variance part of KL(memory ||
        source) for Gaussians, ``(r - 1 - log r) / 2`` with ``r`` the variance ratio (nats; 0 when they are the
        source's)."""
        moments = memory.mean(axis=0) if isinstance(memory, np.ndarray) else memory.moments()
        out = []
        for part, squares, source in zip(self.gated, self._gated_squares, self._gated_var, strict=True):
            mean = moments[part]
            ratio = (np.maximum(moments[squares] - mean * mean, 0.0) + SHIFT_EPS) / source
            out.append(0.5 * float((ratio - 1.0 - np.log(ratio)).sum()) / len(ratio))
        return out

    def gates(self, memory: StatisticsMemory, own: list[float] | None = None) -> list[float]:
        """Per gated layer, the share of its adaptation its variances get: 0 while the memory's variances are
        within ``gate`` nats a channel of the source's (clean data: the stem keeps the source's variances, its
        means follow), rising linearly to 1 at twice that (a contrast, blur or noise shift) -- or as the
        entries' excess noise rises from ``NOISE_GATE`` to twice that, the shift the input denoising took
        out of the stem's sight, whichever is more open. ``own``: :meth:`first_gates` of the memory, where
        the caller has them."""
        noise = opening(memory.noise_level, NOISE_GATE)
        return [max(noise, gate) for gate in (self.first_gates(memory) if own is None else own)]

    def first_gates(self, stats: StatisticsMemory | np.ndarray) -> list[float]:
        """The gates the stem's own shift opens (:meth:`shift`), alone: those of a stream's first batch (its
        examples' statistics, N x width), which has no memory to measure on, and how far a class-ordered
        stream's batch counts in the stem (``engine``). The entries' excess noise is not read here: a shift
        the stem cannot see is no reason to follow one batch's stem statistics, and a class-ordered batch is
        one class."""
        return [opening(shift, self.gate) for shift in self.shift(stats)]

    def coverage(
        self,
        memory: StatisticsMemory,
        gates: list[float] | None = None,
        correlated: bool | Callable[[], bool] = True,
    ) -> float:
        """The class coverage the deep layers weigh the memory by: the classes it holds
        (:attr:`StatisticsMemory.coverage`) -- unless the stream's labels arrive correlated in time
        (``correlated``, ``streams.LabelHistory``; a callable is asked only where the answer matters) and the
        stem measures no shift: then their :attr:`~StatisticsMemory.support`, the plain count again as the
        gate opens (interpolated by the most open gate). A memory whose entries carry the restoration's
        readings (:attr:`~StatisticsMemory.measured`) divides either by the square root of how many times the
        source counts while nothing measures a shift, in any order (``SHUT_PRIOR`` with nothing measured, once
        with the gate or the entries' detail deficit open). Without a gate, the plain count."""
        if not self.gated or gates is None:
            return memory.coverage
        g = max(gates, default=0.0)
        if g >= 1.0:
            return memory.coverage
        if memory.measured:  # a shut gate means no shift: what the memory differs by is mostly noise
            count = memory.coverage
            if _answer(correlated):
                count = _by_support(count, memory.support, g)
            seen = max(g, opening(memory.deficit_level, BLUR_GATE))
            return count / math.sqrt(1.0 + (SHUT_PRIOR - 1.0) * (1.0 - seen))
        support = memory.support
        if support >= memory.coverage or not _answer(correlated):  # nothing to count differently: no test
            return memory.coverage
        # the gate alone: a shift the stem barely sees keeps it shut
        return _by_support(memory.coverage, support, g)

    def blend(
        self,
        memory: StatisticsMemory,
        gates: list[float] | None = None,
        correlated: bool | Callable[[], bool] = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean, var) of the mixture of two distributions: the source with weight ``strength`` and the
        memory's examples with weight their count -- in deep channels their count times the square of the
        memory's class coverage (:meth:`coverage`): class-specific features are estimated from the classes seen
        so far only, so a memory of two classes out of ten counts 4% of its examples there (a class-sorted stream), one of
        all classes fully. ``gates`` (per gated layer, :meth:`gates`) scale the memory's weight in the
        variances of those layers (the mixture's variance with that weight; the means keep theirs)."""
        coverage = self.coverage(memory, gates, correlated)
        key = (memory.size, coverage)
        w = self._weights.get(key)
        if w is None:
            if len(self._weights) > MAX_WEIGHTS:
                self._weights.clear()
            count = np.where(self._deep, memory.size * coverage**2, memory.size)
            w = self._weights[key] = count / (count + self._strength)
        s = len(self.mean)
        moments = memory.moments()
        mixed = self.moments + w * (moments - self.moments)
        mean = mixed[:s]
        var = np.maximum(mixed[s:] - mean * mean, 0.0)
        for part, squares, g in zip(self.gated, self._gated_squares, gates or (), strict=False):
            if g == 1.0:  # open: the blend as it is
                continue
            if g == 0.0:  # shut: the source's variances
                var[part] = self.var[part]
                continue
            v = w[part] * g  # the mixture's variance with weight v
            d = moments[part] - self.mean[part]
            spread = np.maximum(moments[squares] - moments[part] ** 2, 0.0)
            var[part] = (1 - v) * self.var[part] + v * spread + v * (1 - v) * d * d
        return mean, var
