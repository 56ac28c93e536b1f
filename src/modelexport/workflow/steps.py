"""The pipeline's shared steps: staging the package, exporting the trained network, data and latency."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .._io import atomic_dir
from ..data import Dataset, load_dataset
from ..export.api import ExportResult, export
from ..train.networks import Network, NetworkOptions
from .config import PipelineConfig

__all__ = [
    "staged_package",
    "rename_model",
    "export_network",
    "latency_stats",
    "load_pipeline_data",
    "network_options",
]


@contextmanager
def staged_package(cfg: PipelineConfig) -> Iterator[Path]:
    """A staging folder moved onto the package folder on success (nothing written on failure)."""
    with atomic_dir(cfg.package_dir) as staging:
        yield staging


def rename_model(staging: Path, target_name: str) -> None:
    """``model.onnx`` -> ``NAME.onnx`` (and its sidecar) when ``--output_model`` names the file."""
    if target_name == "model.onnx":
        return
    stem = Path(target_name).stem
    (staging / "model.onnx").rename(staging / target_name)
    side = staging / "model_hierarchy.json"
    if side.exists():
        side.rename(staging / f"{stem}_hierarchy.json")


def export_network(network: Network, staging: Path, keep_batchnorm: bool) -> ExportResult:
    """Export the trained network into ``staging`` (HF folder or plain module, with labels and processor)."""
    with tempfile.TemporaryDirectory(prefix="modelexport-train-") as tmp:
        source, options = network.export_source(Path(tmp))
        if keep_batchnorm:
            options["keep_batchnorm"] = True
        return export(source, staging, **options)


def latency_stats(times_ms: list[float], examples: int) -> dict[str, float]:
    """p50/p95 per request and throughput over the whole run."""
    total_s = sum(times_ms) / 1000.0
    return {
        "latency_ms_p50": round(float(np.percentile(times_ms, 50)), 3),
        "latency_ms_p95": round(float(np.percentile(times_ms, 95)), 3),
        "throughput_per_s": round(examples / total_s, 1) if total_s > 0 else 0.0,
    }


def load_pipeline_data(cfg: PipelineConfig, dataset: Dataset | None) -> tuple[Dataset, Dataset, Dataset]:
    """(full, train, val) with a stratified split."""
    full = (
        dataset if dataset is not None else load_dataset(cfg.dataset_path, cfg.text_column, cfg.label_column)
    )
    train, val = full.split(cfg.val_split, cfg.seed)
    return full, train, val


def network_options(cfg: PipelineConfig) -> NetworkOptions:
    return NetworkOptions(
        base_model=cfg.base_model, max_length=cfg.max_length, seed=cfg.seed, keep_batchnorm=bool(cfg.ttt)
    )
