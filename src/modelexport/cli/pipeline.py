"""``modelexport pipeline``: train with DSPy, export, quantize, choose a test-time policy, report.

With no options it runs the embedded default (``make demo``): the image classifier on
``sklearn:digits`` with TTA, BN adaptation and dynamic quantization. Options use the requirements'
underscore spellings; dash spellings are accepted too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import click

from ..train.networks import NETWORKS
from ..train.settings import DEFAULT_MC_PASSES, ENSEMBLES, FALSE_WORDS, TRUE_WORDS, TTT_METHODS
from .display import columns
from .options import Decorated, OptionValue, overwrite_option

__all__ = ["pipeline_cmd"]

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


class _TTTValue(click.ParamType):
    """``--ttt``: a boolean word (true/false, yes/no, 1/0) or a method name (bn, tent, sar)."""

    name = "true|false|bn|tent|sar"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        word = str(value).strip().lower()
        if word in TRUE_WORDS | FALSE_WORDS or word in TTT_METHODS:
            return word
        self.fail(f"{value!r} is not valid; valid: true, false, {', '.join(TTT_METHODS)}", param, ctx)


TTT = _TTTValue()


def _defaults(name: str) -> str:
    """A per-model-type default as --help prints it, from the registry the run reads."""
    return ", ".join(f"{spec.defaults[name]:g} {n}" for n, spec in sorted(NETWORKS.items()))


def _opt(name: str, **kwargs: object) -> Callable[[Decorated], Decorated]:
    """An option spelled ``--name_with_underscores`` with the ``--name-with-dashes`` alias."""
    flags = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    return click.option(*flags, name, **kwargs)


def _bool_opt(name: str, default: bool | None, help: str) -> Callable[[Decorated], Decorated]:
    """A ``true|false`` option (:func:`_opt`); a bare ``--name`` is true."""
    return _opt(
        name,
        type=click.BOOL,
        is_flag=False,
        flag_value=True,
        default=default,
        show_default=default is not None,
        help=help,
    )


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
@_bool_opt(
    "tta",
    default=None,
    help="Test-time augmentation true|false (a bare --tta: true) [default: the policy search decides].",
)
@_opt(
    "tta_transforms",
    default=None,
    help="Comma list of TTA transforms (flip = hflip, rotate = rot90 for images); implies --tta "
    "[default: the search tries the model type's standard sets].",
)
@_opt(
    "tta_aggregate",
    default=None,
    help="How TTA views are merged: mean, mean_logits, geometric_mean, max, median, vote, "
    "tsharpen [default: the search tries mean and geometric_mean].",
)
@_opt(
    "ttt",
    type=TTT,
    is_flag=False,
    flag_value="true",
    default=None,
    help="Test-time training: true|false or the method, bn (BatchNorm statistics), tent or sar (entropy "
    "minimisation); a bare --ttt: true, which is bn [default: the search decides (bn) where the network has "
    "BatchNorm].",
)
@_opt(
    "ttt_iterations",
    type=int,
    default=None,
    help="TTT iterations per batch: tent/sar gradient steps at --learning_rate; bn passes of the batch's own "
    "statistics (1: the robust memory statistics) [default: 1].",
)
@_opt(
    "mc_dropout",
    type=int,
    default=None,
    help=f"MC-dropout passes per batch, 0 off [default: the search tries {DEFAULT_MC_PASSES}].",
)
@_opt(
    "ensemble",
    type=click.Choice(list(ENSEMBLES)),
    default=None,
    help="int8: average the model with its int8 twin (needs --quantize) [default: the search decides].",
)
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
    "batch_size",
    type=int,
    default=None,
    help=f"Training and inference batch size [default: {_defaults('batch_size')}].",
)
@_opt(
    "learning_rate",
    type=float,
    default=None,
    help=f"AdamW learning rate, also Tent's/SAR's at test time [default: {_defaults('learning_rate')}].",
)
@_opt(
    "epochs",
    type=int,
    default=None,
    help=f"Maximum epochs (early stopping on validation accuracy) [default: {_defaults('epochs')}].",
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
@_bool_opt(
    "optimize_policy",
    default=True,
    help="Search the test-time settings left open on the validation set (what you set always runs); false: "
    "open settings take the model type's default.",
)
@_bool_opt(
    "anchors",
    default=True,
    help="Image models: record four training images per class in the package (modelexport.source_anchors), "
    "against which test-time adaptation measures a noisy stream, where the validation images gain from them; "
    "false: record none (they are training data).",
)
@_opt("report", default=None, help="Report JSON path [default: pipeline_report.json beside the model].")
@overwrite_option(
    "--output_model and --report",
    "A folder's earlier package is replaced: its recorded files this run does not write are removed.",
)
def pipeline_cmd(**options: OptionValue) -> int:
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
