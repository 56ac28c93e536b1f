"""Dataset -> feeds for ORT calibration and for the int8 vs fp32 comparison.

Data is read by :func:`modelexport.data.load_dataset` (the one reader stack: tables, image folders, the
one ``.npz`` convention, labels as words or ids, labels optional here). Examples become feeds through the
model's own processor (:class:`~modelexport.inference.processors.ONNXAutoProcessor`): texts are tokenized
one batch at a time (padded to the batch's longest, or to the graph's fixed length), images go through its
image processor, arrays are cast to the graph's dtypes. ORT reads the feeds with :class:`FeedReader`, one
batch per calibration step, so batches of different shapes never meet in one array.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Dataset, load_dataset
from ..errors import ConfigError, DatasetError, MetadataError
from ..inference.processors import BaseONNXProcessor, ONNXAutoProcessor, ProcessorSources
from .carry import model_metadata, read_sidecar

__all__ = [
    "FEEDERS",
    "FeedReader",
    "SampleSet",
    "calibration_reader",
    "dataset_samples",
    "find_model_dir",
    "load_samples",
    "register_feeder",
]

log = logging.getLogger(__name__)


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
FEEDERS: dict[str, Feeder] = {}


def register_feeder(kind: str) -> Callable[[Feeder], Feeder]:
    def deco(fn: Feeder) -> Feeder:
        FEEDERS[kind] = fn
        return fn

    return deco


@register_feeder("text")
def _texts(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    return model.processor(texts=batch.texts)


@register_feeder("image")
def _images(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    return model.processor(images=batch.images)


@register_feeder("tensor")
def _tensor(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    names = [i.name for i in model.inputs.inputs]
    if len(names) != 1:
        raise DatasetError(
            f"{batch.source}: 'x' feeds a single-input model; this one has inputs {names}",
            hint="save one array per input, named after it: np.savez(path, " + "=..., ".join(names) + "=...)",
        )
    return model.inputs.cast({names[0]: batch.x})  # type: ignore[dict-item]


@register_feeder("feeds")
def _named(batch: Dataset, model: _Model) -> dict[str, np.ndarray]:
    arrays = batch.feeds or {}
    optional = {"token_type_ids"} if "input_ids" in arrays else set()
    missing = [i.name for i in model.inputs.inputs if i.name not in arrays and i.name not in optional]
    if missing:
        raise DatasetError(
            f"{batch.source}: no array for model input(s) {missing}; the file has {sorted(arrays)}",
            hint="name the .npz arrays after the graph inputs (or use 'x' for a single-input model)",
        )
    return model.inputs.cast(arrays)


def find_model_dir(onnx_path: Path | None, explicit: str | None = None) -> Path | None:
    """Where the tokenizer / processor lives: explicit, beside the ONNX file, or the exported source folder."""
    if explicit:
        path = Path(explicit)
        if not path.is_dir():
            raise ConfigError(f"tokenizer/processor folder not found: {path}")
        return path
    if onnx_path is None:
        return None
    here = onnx_path.parent
    markers = ("tokenizer_config.json", "tokenizer.json", "preprocessor_config.json", "vocab.txt")
    if any((here / m).is_file() for m in markers):
        return here
    source = ((read_sidecar(onnx_path) or {}).get("model") or {}).get("name_or_path")
    if source and Path(str(source)).is_dir():
        return Path(str(source))
    return None


def _batches(n: int, batch_size: int, fixed: int | None) -> list[list[int]]:
    """Example indices per batch; a graph with a fixed batch gets full batches (the last one wraps around)."""
    size = fixed or batch_size
    out = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    if fixed and out and len(out[-1]) < fixed:
        out[-1] += [i % n for i in range(fixed - len(out[-1]))]
    return out


def dataset_samples(
    dataset: Dataset, sources: ProcessorSources, limit: int, *, seed: int = 0, batch_size: int = 1
) -> SampleSet:
    """Up to ``limit`` examples of ``dataset`` (seeded draw) as feeds of ``batch_size`` examples each.

    Labels become the model's class ids (words through its ``id2label``), so accuracy compares like with like.
    Calibration and ``--eval-data`` use ``batch_size=1``: a padded position puts the attention mask's
    dtype-minimum scores into the activation ranges (entropy calibration then fails to bin them).
    """
    if dataset.kind not in FEEDERS:
        raise DatasetError(
            f"{dataset.source}: no feeds for {dataset.kind} data (known: {', '.join(FEEDERS)})"
        )
    chosen = dataset.sample(limit, seed)
    model = _Model(sources)
    feed = FEEDERS[chosen.kind]
    fixed = model.inputs.fixed_batch if model.inputs.inputs else None
    batches = _batches(len(chosen), batch_size, fixed)
    feeds = [feed(chosen.subset(idx), model) for idx in batches]
    ids = chosen.class_ids(sources.model_config.get("id2label"))
    labels = None if ids is None else [ids[i] for idx in batches for i in idx]
    return SampleSet(feeds, labels, chosen.kind)


def load_samples(
    source: str | Path,
    model: Any,
    onnx_path: str | Path | None,
    limit: int,
    *,
    tokenizer: str | None = None,
    seed: int = 0,
    batch_size: int = 1,
) -> SampleSet:
    """Read ``source`` with :func:`load_dataset` (labels optional) and turn up to ``limit`` examples into
    feeds for ``model`` (a ModelProto saved at ``onnx_path``) through its own processor."""
    path = Path(source)
    if not path.exists():
        raise DatasetError(
            f"calibration/eval data not found: {path}",
            hint="check the path given to --calibration-data/--eval-data",
        )
    dataset = load_dataset(path, require_labels=False)
    if onnx_path is None:
        raise ConfigError("feeds need the model's file (its processor files and graph inputs live there)")
    onnx_file = Path(onnx_path)
    sources = ONNXAutoProcessor.sources(onnx_file, metadata=model_metadata(model))
    folder = find_model_dir(onnx_file, tokenizer)
    if folder is not None and folder != sources.folder:
        sources = replace(sources, folder=folder)
    samples = dataset_samples(dataset, sources, limit, seed=seed, batch_size=batch_size)
    log.info("%s: %d %s examples in %d feed(s)", path, len(samples), samples.kind, len(samples.feeds))
    return samples


class FeedReader:
    """ORT's calibration data reader over :class:`SampleSet` feeds (ORT recognises it by ``get_next``).

    ``__len__`` and ``set_range`` let ``quantize_static`` collect one batch per step
    (``CalibStridedMinMax``): its histogram calibrators (entropy, percentile) stack every collected
    output into one array, which fails for batches of different sequence lengths.
    """

    #: ``quantize_static(extra_options=...)`` that makes ORT calibrate one feed at a time.
    EXTRA_OPTIONS: dict[str, Any] = {"CalibStridedMinMax": 1}

    def __init__(self, samples: SampleSet, progress: bool = False) -> None:
        from tqdm.auto import tqdm

        self._feeds = samples.feeds
        self._range = (0, len(self._feeds))
        self._next = 0
        self._bar = tqdm(
            total=len(samples), desc="calibrating", unit="sample", disable=not progress, leave=False
        )

    def __len__(self) -> int:
        return len(self._feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._range = (start_index, min(end_index, len(self._feeds)))
        self._next = start_index

    def get_next(self) -> dict[str, Any] | None:
        if self._next >= self._range[1]:
            if self._range[1] >= len(self._feeds):
                self._bar.close()
            return None
        feed = self._feeds[self._next]
        self._next += 1
        self._bar.update(len(next(iter(feed.values()))))
        return feed

    def rewind(self) -> None:
        """Start over (multi-pass calibrators read the data more than once)."""
        self.set_range(0, len(self._feeds))


def calibration_reader(samples: SampleSet, progress: bool = False) -> tuple[FeedReader, dict[str, Any]]:
    """The reader for ``quantize_static`` and the ``extra_options`` it needs."""
    return FeedReader(samples, progress), dict(FeedReader.EXTRA_OPTIONS)
