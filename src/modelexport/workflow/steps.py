"""The pipeline's shared steps: where it writes, exporting the trained network, data and latency."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..data import Dataset, load_dataset
from ..export.api import ExportResult, export
from ..onnxfile import PACKAGE_MANIFEST, OutputPlan, own_files, plan_output, sidecar_path_for
from ..train.networks import Network, NetworkOptions
from .config import REPORT_NAME, PipelineConfig

__all__ = [
    "output_plans",
    "export_network",
    "latency_stats",
    "load_pipeline_data",
    "network_options",
]


def output_plans(cfg: PipelineConfig) -> tuple[OutputPlan, OutputPlan | None]:
    """Where the run writes (the one output rule), checked before any work: the package (the model, its
    int8 copy, the manifest and the report) and, with ``--report`` outside it, the report file."""
    model = cfg.model_file.name
    package = [PACKAGE_MANIFEST]
    if cfg.quantized_file is not None:
        package += [cfg.quantized_file.name, sidecar_path_for(cfg.quantized_file).name]
    inside = cfg.report_inside()
    if inside:
        package.append(cfg.report_file.name)
    inputs = (cfg.dataset_path, cfg.base_model)
    plan = plan_output(
        cfg.output_model,
        model,
        inputs=inputs,
        package=[n for n in package if n not in own_files(model)],
        bare_is_folder=True,
        package_folder=True,
        overwrite=cfg.overwrite,
    )
    report = (
        None if inside else plan_output(cfg.report_file, REPORT_NAME, inputs=inputs, overwrite=cfg.overwrite)
    )
    return plan, report


def export_network(
    network: Network, output: Path, keep_batchnorm: bool, keep_dropout: bool = False
) -> ExportResult:
    """Export the trained network to ``output`` (a folder, or the model file in a staging folder), as an
    HF folder or a plain module, with labels and processor; ``keep_dropout`` keeps the Dropout nodes MC
    dropout samples (ONNX Runtime removes them from a plain run)."""
    with tempfile.TemporaryDirectory(prefix="modelexport-train-") as tmp:
        source, options = network.export_source(Path(tmp))
        if keep_batchnorm:
            options["keep_batchnorm"] = True
        if keep_dropout:
            options["keep_dropout"] = True
        return export(source, output, **options)


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
