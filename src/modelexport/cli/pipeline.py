"""``modelexport pipeline``: train with DSPy, export, quantize, choose a test-time policy, report.

With no options it runs the embedded default (``make demo``): the image classifier on
``sklearn:digits`` with TTA, BN adaptation and dynamic quantization. Options use the requirements'
underscore spellings; dash spellings are accepted too.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from ..train.networks import NETWORKS
from .display import columns
from .options import overwrite_option

__all__ = ["pipeline_cmd"]

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _opt(name: str, **kwargs: Any) -> Any:
    """An option spelled ``--name_with_underscores`` with the ``--name-with-dashes`` alias."""
    flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    return click.option(*flags, name, **kwargs)


@click.command("pipeline")
@_opt(
    "model_type",
    type=click.Choice(sorted(NETWORKS)),
    default="image_classifier",
    show_default=True,
    help="What to train: " + "; ".join(f"{n}: {s.description}" for n, s in sorted(NETWORKS.items())) + ".",
)
@_opt(
    "dataset_path",
    default="sklearn:digits",
    show_default=True,
    help="CSV/TSV/JSON/JSONL (text,label), image folder (one sub-folder per class), CSV of image paths, "
    ".npz (x, y) or sklearn:digits.",
)
@_opt(
    "output_model",
    default="runs/pipeline",
    show_default=True,
    help="A path ending in .onnx is the model file, its package beside it (in a new or empty folder, or one an "
    "earlier run wrote); otherwise the package folder (model.onnx inside).",
)
@_opt(
    "tta",
    type=click.BOOL,
    default=None,
    help="Test-time augmentation true|false [default: on for images, off for text].",
)
@_opt(
    "tta_transforms",
    default=None,
    help="Comma list of TTA transforms (default: search the modality's standard sets).",
)
@_opt(
    "tta_aggregate",
    default=None,
    help="How TTA views are merged: mean, mean_logits, geometric_mean, max, median, vote, "
    "tsharpen (default: search mean and geometric_mean).",
)
@_opt(
    "ttt",
    type=click.BOOL,
    default=None,
    help="Test-time training (BN adaptation) true|false [default: on when the network has BatchNorm].",
)
@_opt("ttt_iterations", type=int, default=1, show_default=True, help="BN adaptation iterations per batch.")
@_opt(
    "quantize",
    type=click.Choice(["none", "dynamic", "static"]),
    default="dynamic",
    show_default=True,
    help="int8 quantization; the int8 model <stem>_<mode>.onnx is the one deployed and reported.",
)
@_opt(
    "ep",
    default="cpu",
    show_default=True,
    help="Execution provider(s), a comma list in fallback order (cpu, cuda, tensorrt...).",
)
@_opt(
    "batch_size", type=int, default=None, help="Training and inference batch size [default: per model type]."
)
@_opt("learning_rate", type=float, default=None, help="AdamW learning rate [default: 1e-4 text, 3e-3 image].")
@_opt(
    "epochs",
    type=int,
    default=None,
    help="Maximum epochs (early stopping on validation accuracy) [default: 1 text, 10 image].",
)
@_opt(
    "log_level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="modelexport's logging (the stage lines and the report print at any level); INFO adds each step's "
    "details, DEBUG DSPy's and transformers' own lines.",
)
@_opt(
    "base_model",
    default=None,
    help="Text encoder: local Hugging Face folder or hub id [default: all-MiniLM-L6-v2].",
)
@_opt("text_column", default=None, help="Text (or image path) column [default: auto-detected].")
@_opt("label_column", default=None, help="Label column [default: auto-detected].")
@_opt("val_split", type=float, default=0.2, show_default=True, help="Stratified validation fraction.")
@_opt(
    "seed", type=int, default=0, show_default=True, help="Seed for the split, initialisation and random TTA."
)
@_opt(
    "iterations",
    type=int,
    default=3,
    show_default=True,
    help="Inference stage: timed passes over the validation set (latency p50/p95, throughput).",
)
@_opt(
    "latency_budget_ms", type=float, default=None, help="Policy search: the slowest acceptable ms per batch."
)
@_opt(
    "optimize_policy",
    type=click.BOOL,
    default=True,
    show_default=True,
    help="Search the test-time policy on the validation set (false: apply the TTA/TTT options as given).",
)
@_opt("report", default=None, help="Report JSON path [default: pipeline_report.json beside the model].")
@overwrite_option(
    "--output_model and --report",
    "A folder's earlier package is replaced: its recorded files this run does not write are removed.",
)
def pipeline_cmd(**options: Any) -> int:
    """Train a classifier with DSPy, export it, quantize it, choose its test-time policy, and report."""
    from rich.console import Console

    from ..workflow import PipelineConfig, run_pipeline  # defers dspy and torch: --help stays light

    _logging(options["log_level"])
    config = PipelineConfig(**options)
    run_pipeline(config, console=Console(width=columns(), highlight=False))
    return 0


def _logging(level: str) -> None:
    """``--log_level`` for modelexport; DSPy's per-evaluation lines and transformers' notices only at DEBUG
    (other libraries stay as the global ``--debug`` set them)."""
    import os

    value = getattr(logging, level.upper())
    if value > logging.DEBUG:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import dspy  # noqa: F401 - dspy sets up its own logger on import; adjust it afterwards

    logging.getLogger("modelexport").setLevel(value)
    logging.getLogger("dspy").setLevel(value if value <= logging.DEBUG else logging.ERROR)
