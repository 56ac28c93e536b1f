"""A labelled dataset -> model feeds, through the model's own processor: the one path for evaluation,
calibration, the int8 comparison and the pipeline.

Texts are tokenized one batch at a time (padded to the batch's longest, or to the graph's fixed
length), images go through the model's image processor, arrays are cast to the graph's dtypes. Labels
become the model's class ids (words through its ``id2label``), so accuracy compares like with like.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._registry import Registry
from ..data import Dataset
from ..errors import ConfigError, DatasetError, MetadataError
from .processors import BaseONNXProcessor, ONNXAutoProcessor, ProcessorSources

__all__ = ["FEEDERS", "SampleSet", "check_modality", "dataset_feeds", "dataset_samples"]


@dataclass
class SampleSet:
    """Feeds (input name -> array), one per batch, and the examples' integer labels when the data has them."""

    feeds: list[dict[str, Any]]
    labels: list[int] | None = None
    kind: str = ""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        """Examples (not batches): what ``--calibration-samples`` counts."""
        return sum(len(next(iter(f.values()))) if f else 0 for f in self.feeds)


class _Model:
    """The model side of the feeds: its graph inputs, and its processor built on first use (texts, images)."""

    def __init__(self, sources: ProcessorSources) -> None:
        self.sources = sources
        self.inputs = BaseONNXProcessor(sources.inputs)
        self._processor: BaseONNXProcessor | None = None

    @property
    def processor(self) -> BaseONNXProcessor:
        if self._processor is None:
            try:
                self._processor = ONNXAutoProcessor.from_sources(self.sources)
            except MetadataError as exc:
                raise ConfigError(
                    f"the data needs the model's processor: {exc}",
                    hint="pass --tokenizer MODEL_DIR (the Hugging Face folder the model was exported from)",
                ) from exc
        return self._processor


Feeder = Callable[[Dataset, _Model], dict[str, np.ndarray]]
#: Dataset kind -> how one batch of it becomes feeds.
FEEDERS: Registry[Feeder] = Registry("dataset kind", error=DatasetError)


@FEEDERS.register("text")
def _texts(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    return check_modality(model.processor, "texts", batch.source)(texts=batch.texts)


@FEEDERS.register("image")
def _images(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    return check_modality(model.processor, "images", batch.source)(images=batch.images)


def check_modality(processor: BaseONNXProcessor, modality: str, source: str) -> BaseONNXProcessor:
    """``processor`` when it reads ``modality``; else a DatasetError naming the data ``source`` (texts for an image
    model: the processor's own refusal names neither)."""
    if processor.modality and modality not in processor.modality.split("+"):
        raise DatasetError(
            f"{source}: holds {modality}; this model's processor ({type(processor).__name__}) takes "
            f"{processor.modality.replace('+', ' and ')}",
            hint=f"pass data of the model's kind ({processor.modality.replace('+', ' and ')})",
        )
    return processor


@FEEDERS.register("tensor")
def _tensor(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    names = [i.name for i in model.inputs.inputs]
    if len(names) != 1:
        raise DatasetError(
            f"{batch.source}: 'x' feeds a single-input model; this one has inputs {names}",
            hint="save one array per input, named after it: np.savez(path, " + "=..., ".join(names) + "=...)",
        )
    return _check_shapes(batch.source, model.inputs.cast({names[0]: batch.x}), model, {names[0]: "x"})  # type: ignore[dict-item]


@FEEDERS.register("feeds")
def _named(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    arrays = batch.feeds or {}
    optional = {"token_type_ids"} if "input_ids" in arrays else set()
    missing = [i.name for i in model.inputs.inputs if i.name not in arrays and i.name not in optional]
    if missing:
        raise DatasetError(
            f"{batch.source}: no array for model input(s) {missing}; the file has {sorted(arrays)}",
            hint="name the .npz arrays after the graph inputs (or use 'x' for a single-input model)",
        )
    return _check_shapes(batch.source, model.inputs.cast(arrays), model)


def _check_shapes(
    source: str, feeds: dict[str, np.ndarray], model: _Model, names: dict[str, str] | None = None
) -> dict[str, np.ndarray]:
    """Arrays read from a file against the graph's inputs: the rank and every fixed size after axis 0 (the
    examples). ONNX Runtime's own refusal names neither the file nor the array."""
    for spec in model.inputs.inputs:
        array = feeds.get(spec.name)
        if array is None or not spec.shape:
            continue
        fits = array.ndim == len(spec.shape) and all(
            want is None or got == want for got, want in zip(array.shape[1:], spec.shape[1:], strict=True)
        )
        if not fits:
            want = ", ".join("?" if d is None else str(d) for d in spec.shape[1:])
            name = (names or {}).get(spec.name, spec.name)
            raise DatasetError(
                f"{source}: array {name!r} holds examples of shape {list(array.shape[1:])}; the model's input "
                f"{spec.name!r} takes examples of shape [{want}]" + (" (?: any size)" if "?" in want else ""),
                hint="a .npz holds model-ready arrays, examples on axis 0 (`modelexport metadata MODEL` lists "
                "the model's inputs)",
            )
    return feeds


def _batches(n: int, batch_size: int, fixed: int | None) -> list[list[int]]:
    """Example indices per batch; a graph with a fixed batch gets full batches (the last one wraps around)."""
    size = fixed or batch_size
    out = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    if fixed and out and len(out[-1]) < fixed:
        out[-1] += [i % n for i in range(fixed - len(out[-1]))]
    return out


def _feeder(dataset: Dataset) -> Feeder:
    if dataset.kind not in FEEDERS:
        raise DatasetError(
            f"{dataset.source}: no feeds for {dataset.kind} data (known: {', '.join(FEEDERS)})"
        )
    return FEEDERS[dataset.kind]


def dataset_feeds(dataset: Dataset, sources: ProcessorSources) -> dict[str, np.ndarray]:
    """All of ``dataset``, in order, as one batch of feeds (checked against and cast to the graph's inputs)."""
    return _feeder(dataset)(dataset, _Model(sources))


def dataset_samples(
    dataset: Dataset, sources: ProcessorSources, limit: int, *, seed: int = 0, batch_size: int = 1
) -> SampleSet:
    """Up to ``limit`` examples of ``dataset`` (seeded draw) as feeds of ``batch_size`` examples each.

    Labels become the model's class ids (words through its ``id2label``), so accuracy compares like with like.
    Calibration and ``--eval-data`` use ``batch_size=1``: a padded position puts the attention mask's
    dtype-minimum scores into the activation ranges (entropy calibration then fails to bin them).
    """
    feed = _feeder(dataset)
    chosen = dataset.sample(limit, seed)
    model = _Model(sources)
    fixed = model.inputs.fixed_batch if model.inputs.inputs else None
    batches = _batches(len(chosen), batch_size, fixed)
    feeds = [feed(chosen.subset(idx), model) for idx in batches]
    ids = chosen.class_ids(sources.model_config.get("id2label"))
    labels = None if ids is None else [ids[i] for idx in batches for i in idx]
    return SampleSet(feeds, labels, chosen.kind)
