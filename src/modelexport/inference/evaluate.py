"""Measure a test-time policy on a labelled dataset: accuracy, latency per batch and throughput.

``evaluate(model, data, policy)`` is what ``modelexport evaluate`` calls. Data comes from
:func:`modelexport.data.load_dataset` (image folders, CSV/JSON/JSONL text, ``.npz`` with model-ready ``x``
and labels ``y``, ``sklearn:digits``); images and texts go through the model's own processor
(:class:`modelexport.inference.processors.ONNXAutoProcessor`, configured from the embedded metadata).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Dataset, load_dataset
from ..errors import DatasetError, TestTimeError
from ..onnxfile import resolve_model_path
from ..testtime.engine import TestTimeEngine
from ..testtime.policy import TestTimePolicy
from ..testtime.streams import Stream, StreamOrder, stream_order
from .feeds import dataset_samples
from .processors import BaseONNXProcessor, ONNXAutoProcessor

__all__ = ["EvaluationResult", "evaluate"]


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
    n_views: int = 1
    n_augmented: int = 0
    mean_entropy: float | None = None
    provider: str = ""
    #: The .onnx file that ran (a package folder resolves to its deployed model).
    model: str = ""
    baseline: EvaluationResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
            out["accuracy_delta"] = round(self.accuracy - self.baseline.accuracy, 6)
        return out


def _prepare(
    dataset: Dataset, model: Path, batch_size: int
) -> tuple[list[tuple[Any, np.ndarray]], BaseONNXProcessor]:
    """(batches of model feeds -- raw strings for text, so text TTA can augment them -- and class ids).

    Labels are the model's class ids (word labels through its ``id2label``); feeds come from the one
    dataset -> feeds path (:func:`dataset_samples`), the same as calibration and ``--eval-data``.
    """
    sources = ONNXAutoProcessor.sources(model)
    if dataset.kind == "text":
        processor = ONNXAutoProcessor.from_sources(sources)
        labels = np.asarray(dataset.class_ids(sources.model_config.get("id2label")), dtype=np.int64)
        texts = list(dataset.texts)
        return [
            (texts[i : i + batch_size], labels[i : i + batch_size]) for i in range(0, len(labels), batch_size)
        ], processor
    samples = dataset_samples(dataset, sources, len(dataset), batch_size=batch_size)
    labels = np.asarray(samples.labels, dtype=np.int64)
    bounds = np.cumsum([0] + [len(next(iter(f.values()))) for f in samples.feeds])
    batches = [(f, labels[a:b]) for f, a, b in zip(samples.feeds, bounds[:-1], bounds[1:], strict=True)]
    return batches, BaseONNXProcessor(sources.inputs)


def _measure(
    engine: TestTimeEngine, batches: list[Any], processor: Any, num_classes: int | None
) -> dict[str, Any]:
    def one(item: Any, stream: Stream) -> Any:
        if isinstance(item, list):  # texts: TTA augments the strings, then tokenizes
            if engine.policy.tta_transforms:
                return engine.predict_texts(item, processor)
            return engine.run(_select(processor(texts=item), engine), stream)
        return engine.run(_select(item, engine), stream)

    one(batches[0][0], engine.new_stream())  # warm-up (session allocation), not timed, on its own stream
    stream = engine.new_stream()  # every batch of the run: one stream (continual policies adapt along it)
    correct, n, times, views, augmented, entropies = 0, 0, [], 1, 0, []
    for item, labels in batches:
        start = time.perf_counter()
        result = one(item, stream)
        times.append(time.perf_counter() - start)
        probs = result if isinstance(result, np.ndarray) else result.probs
        if probs.ndim != 2:
            raise TestTimeError(
                f"evaluate measures classifiers (N, C) outputs; the model gives shape {list(probs.shape)}"
            )
        if num_classes is not None and probs.shape[1] < num_classes:
            raise DatasetError(f"the data has {num_classes} classes but the model predicts {probs.shape[1]}")
        correct += int((probs.argmax(axis=1) == labels).sum())
        n += len(labels)
        if not isinstance(result, np.ndarray):
            views, augmented = result.n_views, augmented + result.n_augmented
            if result.uncertainty is not None:
                entropies.append(result.uncertainty.entropy)
    ms = np.asarray(times) * 1000.0
    return {
        "accuracy": round(correct / n, 6),
        "latency_ms_p50": round(float(np.percentile(ms, 50)), 4),
        "latency_ms_p95": round(float(np.percentile(ms, 95)), 4),
        "throughput_per_s": round(n / float(np.sum(times)), 2),
        "n": n,
        "n_views": views,
        "n_augmented": augmented,
        "mean_entropy": round(float(np.concatenate(entropies).mean()), 6) if entropies else None,
        "resets": stream.resets,
    }


def _select(feeds: dict[str, np.ndarray], engine: TestTimeEngine) -> dict[str, np.ndarray]:
    names = [i.name for i in engine.inputs]
    return {k: v for k, v in feeds.items() if k in names}


def evaluate(
    model: str | os.PathLike[str],
    data: Any,
    policy: TestTimePolicy | None = None,
    batch_size: int = 64,
    baseline: bool = False,
    providers: list[str] | tuple[str, ...] | None = None,
    torch_model: Any = None,
    order: str | StreamOrder = "as-is",
    stream: bool = False,
) -> EvaluationResult:
    """Accuracy, latency p50/p95 per batch and throughput of ``policy`` on ``data`` (a path, spec or Dataset).

    ``order``: the stream order of the examples (seeded by the policy's seed); ``stream``: adapt continually
    across the batches (the policy's ``episodic`` is set False) instead of resetting per batch.
    """
    if batch_size < 1:
        raise TestTimeError(f"batch_size must be >= 1, got {batch_size}")
    policy = policy or TestTimePolicy()
    if stream:
        policy = policy.with_changes(episodic=False)
    order = stream_order(order, policy.seed)
    path = resolve_model_path(model)
    dataset = data if isinstance(data, Dataset) else load_dataset(str(data))
    if order.kind != "as-is":
        if dataset.labels is None:
            raise DatasetError(f"--order {order} needs labelled data; {dataset.source} has no labels")
        dataset = dataset.subset(order.indices(dataset.labels))
    runs = [(policy, torch_model)] + ([(TestTimePolicy(), None)] if baseline else [])
    results: list[EvaluationResult] = []
    for pol, tm in runs:
        engine = TestTimeEngine(path, pol, providers, torch_model=tm)
        batches, processor = _prepare(dataset, path, batch_size)
        measured = _measure(engine, batches, processor, dataset.num_classes)
        results.append(
            EvaluationResult(
                batch_size=batch_size,
                policy=pol.to_dict(),
                order=str(order),
                stream=not pol.episodic,
                provider=engine.session_info.provider,
                model=str(path),
                **measured,
            )
        )
    if baseline:
        return replace(results[0], baseline=results[1])
    return results[0]
