"""Measure a test-time policy on a labelled dataset: accuracy, latency per batch and throughput.

``evaluate(model, data, policy)`` is what ``modelexport evaluate`` calls. Data comes from
:func:`modelexport.data.load_dataset` (image folders, CSV/JSON/JSONL text, ``.npz`` with model-ready ``x``
and labels ``y``, ``sklearn:digits``); images and texts go through the model's own processor
(:class:`modelexport.inference.processors.ONNXAutoProcessor`, configured from the embedded metadata).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from .._stages import StageLog
from ..data import Dataset, load_dataset
from ..errors import DatasetError, TestTimeError
from ..onnxfile import resolve_model_path
from ..testtime.engine import TestTimeEngine, TestTimeResult
from ..testtime.ensemble import merge_probabilities
from ..testtime.iterative import LOOPS, Iteration
from ..testtime.policy import TestTimePolicy
from ..testtime.streams import Stream, StreamOrder, stream_order
from .feeds import check_modality, dataset_samples
from .processors import BaseONNXProcessor, ONNXAutoProcessor, ProcessorSources

if TYPE_CHECKING:
    import torch

__all__ = [
    "Batch",
    "Iteration",
    "LOOPS",
    "EvaluationResult",
    "evaluate",
    "BatchMeasure",
    "BatchMeter",
    "summarize",
    "prepare_batches",
    "eval_processor",
    "ordered",
]

log = logging.getLogger(__name__)

#: One batch as :class:`BatchMeter` runs it: raw strings (text TTA augments them before the processor) or
#: model feeds.
Batch: TypeAlias = "list[str] | dict[str, np.ndarray]"


@dataclass(frozen=True)
class EvaluationResult:
    """One configuration's measurements (``baseline``: the plain model's, when asked for)."""

    accuracy: float
    latency_ms_p50: float
    latency_ms_p95: float
    throughput_per_s: float
    n: int
    batch_size: int
    policy: dict[str, Any]
    #: The stream order the batches came in (``as-is``, ``shuffle``, ``class-sorted``, ``dirichlet:A``).
    order: str = "as-is"
    #: Continual adaptation across the batches (one stream) instead of episodic (reset per batch).
    stream: bool = False
    #: Collapse-guard resets to the source during the run.
    resets: int = 0
    #: Batches the stream guard served with the source model (collapse, label shift, too small).
    fallbacks: int = 0
    n_views: int = 1
    n_augmented: int = 0
    mean_entropy: float | None = None
    provider: str = ""
    #: The .onnx file that ran (a package folder resolves to its deployed model).
    model: str = ""
    #: The other models of an ensemble (probabilities averaged with the model's); empty: the model alone.
    ensemble: list[str] = field(default_factory=list)
    baseline: EvaluationResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
            out["accuracy_delta"] = round(self.accuracy - self.baseline.accuracy, 6)
        return out


def eval_processor(kind: str, sources: ProcessorSources, source: str = "the data") -> BaseONNXProcessor:
    """What turns a batch into feeds at run time: the tokenizer for raw texts (so text TTA can augment the
    strings first; a model that reads no texts is a DatasetError naming ``source``), a pass-through for feeds
    the dataset already built."""
    if kind == "text":
        return check_modality(ONNXAutoProcessor.from_sources(sources), "texts", source)
    return BaseONNXProcessor(sources.inputs)


def prepare_batches(
    dataset: Dataset, sources: ProcessorSources, batch_size: int
) -> list[tuple[Batch, np.ndarray]]:
    """(batch of model feeds -- raw strings for text -- and its class ids) per ``batch_size`` examples.

    Labels are the model's class ids (word labels through its ``id2label``); feeds come from the one
    dataset -> feeds path (:func:`dataset_samples`), the same as calibration and ``--eval-data``.
    """
    if dataset.kind == "text":
        labels = np.asarray(dataset.class_ids(sources.model_config.get("id2label")), dtype=np.int64)
        texts = list(dataset.texts)
        return [
            (texts[i : i + batch_size], labels[i : i + batch_size]) for i in range(0, len(labels), batch_size)
        ]
    samples = dataset_samples(dataset, sources, len(dataset), batch_size=batch_size)
    labels = np.asarray(samples.labels, dtype=np.int64)
    bounds = np.cumsum([0] + [len(next(iter(f.values()))) for f in samples.feeds])
    return [(f, labels[a:b]) for f, a, b in zip(samples.feeds, bounds[:-1], bounds[1:], strict=True)]


@dataclass(frozen=True)
class BatchMeasure:
    """One batch's measurement; the metrics are sums over these, so batches measured in several workers
    add up to the same accuracy and ``n`` as one process."""

    correct: int
    n: int
    seconds: float
    n_views: int = 1
    n_augmented: int = 0
    entropy_sum: float = 0.0
    entropy_count: int = 0
    #: Collapse-guard resets during this batch.
    resets: int = 0
    #: The batch was served by the source model (the stream guard).
    fallbacks: int = 0


class BatchMeter:
    """Runs batches through one engine on one stream and measures each (the first call warms the session
    up on its own stream, untimed)."""

    def __init__(
        self,
        engine: TestTimeEngine,
        processor: BaseONNXProcessor,
        num_classes: int | None,
        members: Sequence[TestTimeEngine] = (),
        iteration: Iteration | None = None,
    ) -> None:
        """``members``: an ensemble's other models (each with its own stream), averaged with ``engine``;
        ``iteration``: iterative inference of every batch."""
        self.engine, self.processor, self.num_classes = engine, processor, num_classes
        self.members = list(members)
        self.iteration = iteration
        self.stream: Stream | None = None
        self.member_streams: list[Stream] = []

    def _one(
        self, item: Batch, stream: Stream, engine: TestTimeEngine | None = None
    ) -> TestTimeResult | np.ndarray:
        engine = engine or self.engine
        if isinstance(item, list):  # texts: TTA augments the strings, then tokenizes
            if engine.policy.tta_transforms:
                return engine.predict_texts(item, self.processor)
            item = self.processor(texts=item)
        if self.iteration is not None:
            return self.iteration.run(engine, _select(item, engine), stream)
        return engine.run(_select(item, engine), stream)

    def _all(self, item: Batch) -> TestTimeResult | np.ndarray:
        """The model's result; with an ensemble, its probabilities merged with every member's."""
        assert self.stream is not None
        result = self._one(item, self.stream)
        if not self.members:
            return result
        probs = [result if isinstance(result, np.ndarray) else result.probs]
        for member, stream in zip(self.members, self.member_streams, strict=True):
            out = self._one(item, stream, member)
            probs.append(out if isinstance(out, np.ndarray) else out.probs)
        merged = merge_probabilities(probs)
        if isinstance(result, np.ndarray):
            return merged
        result.probs = merged
        return result

    def measure(self, item: Batch, labels: np.ndarray) -> BatchMeasure:
        if self.stream is None:
            for engine in (self.engine, *self.members):
                self._one(item, engine.new_stream(), engine)  # warm-up (session allocation)
            self.stream = self.engine.new_stream()  # all later batches: one stream (continual policies)
            self.member_streams = [m.new_stream() for m in self.members]
        resets, fallbacks = self.stream.resets, self.stream.fallbacks
        start = time.perf_counter()
        result = self._all(item)
        seconds = time.perf_counter() - start
        probs = result if isinstance(result, np.ndarray) else result.probs
        if probs.ndim != 2:
            raise TestTimeError(
                f"evaluate measures classifiers (N, C) outputs; the model gives shape {list(probs.shape)}"
            )
        if self.num_classes is not None and probs.shape[1] < self.num_classes:
            raise DatasetError(
                f"the data has {self.num_classes} classes but the model predicts {probs.shape[1]}"
            )
        plain = isinstance(result, np.ndarray)
        entropy = None if plain or result.uncertainty is None else result.uncertainty.entropy
        text_views = len(self.engine.policy.tta_transforms) if isinstance(item, list) else 0  # text TTA
        return BatchMeasure(
            correct=int((probs.argmax(axis=1) == labels).sum()),
            n=len(labels),
            seconds=seconds,
            n_views=text_views or (1 if plain else result.n_views),
            n_augmented=0 if plain else result.n_augmented,
            entropy_sum=0.0 if entropy is None else float(np.sum(entropy)),
            entropy_count=0 if entropy is None else int(np.size(entropy)),
            resets=self.stream.resets - resets,
            fallbacks=self.stream.fallbacks - fallbacks,
        )


def summarize(measures: list[BatchMeasure], busy_seconds: float | None = None) -> dict[str, Any]:
    """The metrics of a run from its batches: accuracy, latency p50/p95 per batch, throughput (examples
    per second of model time: ``busy_seconds``, the batches' summed time unless given), ``n``..."""
    n = sum(m.n for m in measures)
    ms = np.asarray([m.seconds for m in measures]) * 1000.0
    busy = float(sum(m.seconds for m in measures)) if busy_seconds is None else busy_seconds
    counted = sum(m.entropy_count for m in measures)
    return {
        "accuracy": round(sum(m.correct for m in measures) / n, 6),
        "latency_ms_p50": round(float(np.percentile(ms, 50)), 4),
        "latency_ms_p95": round(float(np.percentile(ms, 95)), 4),
        "throughput_per_s": round(n / busy, 2),
        "n": n,
        "n_views": max(m.n_views for m in measures),
        "n_augmented": sum(m.n_augmented for m in measures),
        "mean_entropy": round(sum(m.entropy_sum for m in measures) / counted, 6) if counted else None,
        "resets": sum(m.resets for m in measures),
        "fallbacks": sum(m.fallbacks for m in measures),
    }


def _select(feeds: dict[str, np.ndarray], engine: TestTimeEngine) -> dict[str, np.ndarray]:
    names = [i.name for i in engine.inputs]
    return {k: v for k, v in feeds.items() if k in names}


def ordered(data: str | os.PathLike[str] | Dataset, order: StreamOrder) -> Dataset:
    """``data`` (a path, spec or Dataset) loaded, its examples in the stream ``order``."""
    dataset = data if isinstance(data, Dataset) else load_dataset(str(data))
    if order.kind == "as-is":
        return dataset
    if dataset.labels is None:
        raise DatasetError(f"--order {order} needs labelled data; {dataset.source} has no labels")
    return dataset.subset(order.indices(dataset.labels))


def evaluate(
    model: str | os.PathLike[str],
    data: str | os.PathLike[str] | Dataset,
    policy: TestTimePolicy | None = None,
    batch_size: int = 64,
    baseline: bool = False,
    providers: list[str] | tuple[str, ...] | None = None,
    torch_model: torch.nn.Module | None = None,
    order: str | StreamOrder = "as-is",
    stream: bool = False,
    ensemble: Sequence[str | os.PathLike[str]] = (),
    iteration: Iteration | None = None,
) -> EvaluationResult:
    """Accuracy, latency p50/p95 per batch and throughput of ``policy`` on ``data`` (a path, spec or Dataset).

    ``order``: the stream order of the examples (seeded by the policy's seed); ``stream``: adapt continually
    across the batches (the policy's ``episodic`` is set False) instead of resetting per batch;
    ``ensemble``: other models (e.g. the int8 twin) whose probabilities are averaged with the model's, each
    with the same policy (the baseline is the model alone, plain); ``iteration``: iterative inference (the
    external loop or the ONNX ``Loop``; plain policy).
    """
    if iteration is not None and not (policy or TestTimePolicy()).is_plain:
        raise TestTimeError(
            "iterative inference runs the model as it is: give it with no TTA, adaptation or MC dropout",
            hint="drop --tta-transforms/--ttt/--mc-dropout, or --iterate",
        )
    if batch_size < 1:
        raise TestTimeError(f"batch_size must be >= 1, got {batch_size}")
    policy = policy or TestTimePolicy()
    if stream:
        policy = policy.with_changes(episodic=False)
    order = stream_order(order, policy.seed)
    path = resolve_model_path(model)
    others = [resolve_model_path(m) for m in ensemble]
    dataset = ordered(data, order)
    runs = [(policy, torch_model)] + ([(TestTimePolicy(), None)] if baseline else [])
    results: list[EvaluationResult] = []
    stages = StageLog(logger=log)
    for pol, tm in runs:
        with stages.stage("load", "baseline" if pol.is_plain else "policy"):
            main = pol is policy
            model_in = iteration.model(path) if iteration is not None and main else path
            engine = TestTimeEngine(model_in, pol, providers, torch_model=tm)
            members = [TestTimeEngine(m, pol, providers) for m in others] if main else []
            sources = ONNXAutoProcessor.sources(path)
            processor = eval_processor(dataset.kind, sources, dataset.source)
            meter = BatchMeter(engine, processor, dataset.num_classes, members, iteration if main else None)
        with stages.stage("run", f"{len(dataset)} examples, batch {batch_size}") as st:
            measured = summarize([meter.measure(*b) for b in prepare_batches(dataset, sources, batch_size)])
            st["detail"] = f"accuracy {measured.get('accuracy')}"
        results.append(
            EvaluationResult(
                batch_size=batch_size,
                policy=pol.to_dict(),
                order=str(order),
                stream=pol.continual,
                provider=engine.session_info.provider,
                model=str(path),
                ensemble=[str(m) for m in others] if pol is policy else [],
                extra=_iteration_extra(iteration) if pol is policy else {},
                **measured,
            )
        )
    if baseline:
        return replace(results[0], baseline=results[1])
    return results[0]


def _iteration_extra(iteration: Iteration | None) -> dict[str, Any]:
    if iteration is None:
        return {}
    return {
        "iterate": iteration.steps,
        "feedback": dict(iteration.feedback),
        "loop": iteration.loop,
        "tol": iteration.tol,
    }
