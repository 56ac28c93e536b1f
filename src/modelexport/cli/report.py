"""``modelexport report``: write one self-contained HTML page with the module tree, time and differences."""

from __future__ import annotations

import click

from ..inspect.profile import ProfileConfig
from ..inspect.report import ReportConfig, write_report
from .display import echo, progress
from .options import overwrite_option

__all__ = ["report_cmd"]


@click.command("report")
@click.argument("model", type=click.Path())
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(),
    help="The page to write (.html), or a folder (DIR/) that gets report.html.",
)
@click.option("--profile", "with_profile", is_flag=True, help="Add time per module (ONNX Runtime profile).")
@click.option("--runs", type=int, default=10, show_default=True, help="With --profile: timed runs.")
@click.option(
    "--optimization",
    type=click.Choice(["disable", "basic", "extended", "all"]),
    default="basic",
    show_default=True,
    help="With --profile: ORT graph optimization level.",
)
@click.option(
    "--compare",
    "other",
    type=click.Path(),
    default=None,
    help="A second model (e.g. the int8 one): per-module node, op and size differences.",
)
@click.option("--numeric", is_flag=True, help="With --compare: run both; max abs/rel diff per output.")
@click.option(
    "--error-report",
    is_flag=True,
    help="With --compare: the quantization error per module (as quantize --error-report measures it).",
)
@click.option(
    "--inputs",
    type=click.Path(),
    default=None,
    help=".npz with one array per model input (default: generated).",
)
@click.option("--title", default=None, help="Page title (default: the model's file name).")
@overwrite_option("-o")
def report_cmd(
    model: str,
    output: str,
    with_profile: bool,
    runs: int,
    optimization: str,
    other: str | None,
    numeric: bool,
    error_report: bool,
    inputs: str | None,
    title: str | None,
    overwrite: bool,
) -> int:
    """One HTML page (no network needed): module tree with nodes, parameters and boundaries; time; diffs."""

    profile = ProfileConfig(runs=runs, optimization=optimization, inputs=inputs) if with_profile else None
    config = ReportConfig(profile, other, numeric, error_report, inputs, title)
    with progress(f"report {model}"):
        path, data = write_report(model, output, config, overwrite=overwrite)
    parts = [f"{len(data['modules'])} modules"]
    parts += [name for name in ("profile", "compare", "error_report") if data[name]]
    echo(f"wrote {path} ({', '.join(parts)})")
    return 0
