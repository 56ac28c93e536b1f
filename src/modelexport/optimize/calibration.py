"""Calibration and ``--eval-data`` files -> feeds for ORT's calibrators and the int8 vs fp32 comparison.

Data is read by :func:`modelexport.data.load_dataset` (the one reader stack: tables, image folders, the
one ``.npz`` convention, labels as words or ids, labels optional here) and becomes feeds through
:func:`modelexport.inference.feeds.dataset_samples` (the model's own processor). ORT reads the feeds with
:class:`FeedReader`, one batch per calibration step, so batches of different shapes never meet in one array.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._progress import progress_bar
from ..data import load_dataset
from ..errors import ConfigError, DatasetError
from ..inference.feeds import SampleSet, dataset_samples
from ..inference.processors import ONNXAutoProcessor
from ..onnxfile import read_sidecar
from .carry import model_metadata

if TYPE_CHECKING:
    import onnx

__all__ = ["FeedReader", "calibration_reader", "find_model_dir", "load_samples"]

log = logging.getLogger(__name__)


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


def load_samples(
    source: str | Path,
    model: onnx.ModelProto,
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
    _check_finite(path, samples)
    log.info("%s: %d %s examples in %d feed(s)", path, len(samples), samples.kind, len(samples.feeds))
    return samples


def _check_finite(path: Path, samples: SampleSet) -> None:
    """NaN or infinite inputs give ranges no int8 scale fits (ORT then fails an assertion) and outputs no
    comparison means anything: refused, naming the file and the input."""
    for feed in samples.feeds:
        for name, array in feed.items():
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
                raise DatasetError(
                    f"{path}: input {name!r} holds NaN or infinite values",
                    hint="calibration and evaluation need finite numbers; clean the data or leave those rows out",
                )


class FeedReader:
    """ORT's calibration data reader over :class:`SampleSet` feeds (ORT recognises it by ``get_next``).

    ``__len__`` and ``set_range`` let ``quantize_static`` collect one batch per step
    (``CalibStridedMinMax``): its histogram calibrators (entropy, percentile) stack every collected
    output into one array, which fails for batches of different sequence lengths.
    """

    #: ``quantize_static(extra_options=...)`` that makes ORT calibrate one feed at a time.
    EXTRA_OPTIONS: dict[str, Any] = {"CalibStridedMinMax": 1}

    def __init__(self, samples: SampleSet, progress: bool = False) -> None:
        self._feeds = samples.feeds
        self._range = (0, len(self._feeds))
        self._next = 0
        self._bar = progress_bar(
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
