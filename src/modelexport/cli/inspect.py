"""Inspect commands: ``analyze``, ``validate``, ``compare``, ``extract``, ``profile``.

Each command parses options, calls one library function from :mod:`modelexport.inspect` (or
:func:`modelexport.hierarchy.extract.extract_module_subgraph`) and prints or writes a rendering.
Output files follow the one output rule (``modelexport.onnxfile.output``: checked before any work, written
atomically); errors are raised as ModelExportError subclasses for the app.
"""

from __future__ import annotations

from pathlib import Path

import click

from .._io import write_text
from ..errors import ConfigError
from ..inspect.analyze import AnalyzeConfig, analyze
from ..inspect.compare import compare
from ..inspect.extract import call_instances, extract_module_subgraph, extract_plan
from ..inspect.formats import MACHINE_FORMATS, file_name_for, format_for_path, render
from ..inspect.loading import load_tagged_model
from ..inspect.node_data import NODE_DATA_NAME, profile_overlay, write_node_data
from ..inspect.optimum import validate_optimum_compatibility
from ..inspect.profile import ProfileConfig, profile, profile_package
from ..inspect.validate import repair as repair_fn
from ..inspect.validate import validate
from ..onnxfile import OutputPlan, package_components, plan_output
from .display import columns, echo, progress, shorten
from .options import overwrite_option

__all__ = ["analyze_cmd", "validate_cmd", "compare_cmd", "extract_cmd", "profile_cmd"]

_MODEL = click.argument("model", type=click.Path(dir_okay=True))
_HIERARCHY = click.option(
    "--hierarchy",
    type=click.Path(),
    default=None,
    help="model_hierarchy.json to use (default: <model stem>_hierarchy.json beside the model).",
)


_WIDE = click.option(
    "--wide", is_flag=True, help="Do not cut text lines to a 100-column terminal (files are never cut)."
)


def _plan(
    command: str,
    output: str | None,
    fmt: str | None,
    default: str,
    inputs: list[str | None],
    overwrite: bool,
) -> tuple[OutputPlan | None, str]:
    """Where ``-o`` writes (the one output rule, checked before any work) and the format it gets."""
    if not output:
        return None, fmt or default
    fmt = fmt or format_for_path(command, output, default)
    return plan_output(output, file_name_for(command, fmt), inputs=inputs, overwrite=overwrite), fmt


def _emit(command: str, result: object, fmt: str, plan: OutputPlan | None, wide: bool = False) -> None:
    """Render ``result`` and print it (cut to the terminal unless ``wide``), or write it whole where planned."""

    if plan is not None:
        write_text(plan.path, render(command, fmt, result))
        echo(f"wrote {plan.path}")
    elif wide or fmt in MACHINE_FORMATS:
        click.echo(render(command, fmt, result), nl=False)
    else:  # tables: a long row is cut, not wrapped
        echo(render(command, fmt, result), more="--wide (or --format json)", wrap=False)


@click.command("analyze")
@_MODEL
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["summary", "detailed", "json", "csv"]),
    default=None,
    help="summary: module tree (default); detailed: one line per node; json; csv: one row per module.",
)
@click.option(
    "--filter-tag",
    default=None,
    help="Show modules whose tag contains TEXT or matches a glob (*BertLayer.1*).",
)
@click.option(
    "--depth", type=int, default=None, help="Show the module tree down to this depth (1 = root only)."
)
@click.option(
    "--output",
    "-o",
    type=click.Path(),
    default=None,
    help="Write to FILE (format from .json/.csv), or into DIR/ as analyze.txt|.json|.csv.",
)
@overwrite_option("-o")
@_WIDE
def analyze_cmd(
    model: str,
    fmt: str | None,
    filter_tag: str | None,
    depth: int | None,
    output: str | None,
    overwrite: bool,
    wide: bool,
) -> int:
    """Which module owns which nodes, op types and parameters (works without the sidecar)."""

    plan, fmt = _plan("analyze", output, fmt, "summary", [model], overwrite)
    result = analyze(model, AnalyzeConfig(filter_tag=filter_tag, depth=depth))
    _emit("analyze", result, fmt, plan, wide)
    return 0


def _optimum_report(folder: str, fmt: str) -> bool:
    with progress(f"validate --optimum {folder}: loading the folder with Optimum"):
        report = validate_optimum_compatibility(folder)
    if fmt == "json":
        import json

        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        lines = [f"{folder}: Optimum {'compatible' if report.ok else 'NOT compatible'}"]
        echo("\n".join([*lines, *(f"  {f}" for f in report.findings)]), more="--format json")
    return bool(report.ok)


@click.command("validate")
@click.argument("model", type=click.Path(), required=False)
@click.option(
    "--check-consistency",
    is_flag=True,
    help="Compare node tags with model_hierarchy.json (nodes, tags, tensor tags).",
)
@click.option(
    "--repair", is_flag=True, help="Make node tags and sidecar agree again (see --trust), then validate."
)
@click.option(
    "--trust",
    type=click.Choice(["sidecar", "nodes"]),
    default="sidecar",
    show_default=True,
    help="With --repair: rewrite node tags from the sidecar, or the sidecar from the node tags.",
)
@_HIERARCHY
@click.option(
    "--optimum",
    "optimum_dir",
    type=click.Path(),
    default=None,
    help="Also check that an export folder loads in Optimum's ORTModel classes.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
def validate_cmd(
    model: str | None,
    check_consistency: bool,
    repair: bool,
    trust: str,
    hierarchy: str | None,
    optimum_dir: str | None,
    fmt: str,
) -> int:
    """ONNX compliance, hierarchy tag grammar and tree; exit code 1 when there are findings."""

    if model is None and optimum_dir is None:
        raise click.UsageError("give MODEL, --optimum DIR, or both")
    ok = True
    if model is not None:
        if repair:
            fixed = repair_fn(
                model, direction="nodes" if trust == "sidecar" else "sidecar", hierarchy=hierarchy
            )
            lines = [
                f"repair ({fixed.direction}): {len(fixed.changes)} change(s)"
                + (f", wrote {fixed.written}" if fixed.written else "")
            ]
            echo("\n".join([*lines, *(f"  {change}" for change in fixed.changes[:50])]))
        with progress(f"validate {model}"):
            report = validate(model, check_consistency=check_consistency or repair, hierarchy=hierarchy)
        text = render("validate", fmt, report)
        click.echo(text, nl=False) if fmt == "json" else echo(text, more="--format json")
        ok = report.ok
    if optimum_dir is not None:
        ok = _optimum_report(optimum_dir, fmt) and ok
    return 0 if ok else 1


@click.command("compare")
@click.argument("model_a", type=click.Path())
@click.argument("model_b", type=click.Path())
@click.option(
    "--numeric", is_flag=True, help="Run both on the same inputs; report max abs/rel diff per output."
)
@click.option(
    "--inputs",
    type=click.Path(),
    default=None,
    help=".npz with one array per model input (default: generated).",
)
@click.option(
    "--ep", default=None, help="Execution providers for --numeric, e.g. cuda,cpu (CPU is always last)."
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default=None, help="Default text."
)
@click.option(
    "--output",
    "-o",
    type=click.Path(),
    default=None,
    help="Write to FILE (.md markdown, .json json), or into DIR/ as compare.txt|.md|.json.",
)
@overwrite_option("-o")
@_WIDE
def compare_cmd(
    model_a: str,
    model_b: str,
    numeric: bool,
    inputs: str | None,
    ep: str | None,
    fmt: str | None,
    output: str | None,
    overwrite: bool,
    wide: bool,
) -> int:
    """Structural (and with --numeric, numerical) differences between two models."""

    plan, fmt = _plan("compare", output, fmt, "text", [model_a, model_b, inputs], overwrite)
    providers = tuple(p for p in (ep or "").split(",") if p.strip())
    with progress(f"compare {model_a} {model_b}"):
        result = compare(
            model_a, model_b, numeric=numeric or inputs is not None, inputs=inputs, providers=providers
        )
    _emit("compare", result, fmt, plan, wide)
    return 0


def _call(value: str) -> int | str:
    if value == "all":
        return "all"
    try:
        return int(value)
    except ValueError as exc:
        raise click.BadParameter(f"expected a call index (0, 1, ...) or 'all', got {value!r}") from exc


def _list_modules(model: str, hierarchy: str | None, fmt: str) -> None:
    """The extractable modules: module path (what --module takes, as does the tag), nodes, calls, tag."""
    tm = load_tagged_model(model, hierarchy=hierarchy, weights=False)
    modules = (tm.sidecar or {}).get("modules", {})
    paths = (tm.sidecar or {}).get("tags", {})
    rows = []
    for tag in tm.index.all_tags:
        members = tm.index.nodes_within(tag)
        count = modules.get(paths.get(tag), {}).get("call_count") if paths.get(tag) is not None else None
        calls = count if count else len(call_instances(tm.index, members, None) or [members])
        rows.append({"module_path": paths.get(tag), "tag": tag, "nodes": len(members), "calls": calls})
    if fmt == "json":
        import json

        click.echo(json.dumps(rows, indent=2))
        return
    width = min(max((len(r["module_path"] or "") for r in rows), default=0), columns() // 2)
    lines = [f"{'module path':<{width}} {'nodes':>6} {'calls':>5}  module tag"]
    for r in rows:
        path = shorten(r["module_path"] or "(root)" if r["module_path"] is not None else "-", width)
        lines.append(f"{path:<{width}} {r['nodes']:>6} {r['calls']:>5}  {r['tag']}")
    echo("\n".join(lines), more="--format json", wrap=False)


@click.command("extract")
@_MODEL
@click.option(
    "--module",
    "-m",
    "module",
    default=None,
    help="Module tag (/BertModel/BertEncoder/BertLayer.0) or module path (encoder.layer.0).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(),
    default=None,
    help="SUB.onnx, or a folder (DIR/, or any path not ending in .onnx) that gets <module>.onnx.",
)
@click.option(
    "--call",
    "call",
    default="0",
    show_default=True,
    help="Call site of a module called several times (0-based), or 'all'.",
)
@click.option(
    "--list",
    "list_only",
    is_flag=True,
    help="List the modules that can be extracted, with node and call counts.",
)
@_HIERARCHY
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@overwrite_option("-o")
def extract_cmd(
    model: str,
    module: str | None,
    output: str | None,
    call: str,
    list_only: bool,
    hierarchy: str | None,
    fmt: str,
    overwrite: bool,
) -> int:
    """Cut one module out as a standalone, runnable ONNX model (inputs/outputs = its tensor boundary)."""
    import json

    if list_only:
        _list_modules(model, hierarchy, fmt)
        return 0
    if not module or not output:
        raise click.UsageError("extract needs --module TAG and --output SUB.onnx (or --list)")
    plan = extract_plan(output, module, [model, hierarchy], overwrite)
    with progress(f"extract {module} from {model}"):
        sub = extract_module_subgraph(model, hierarchy, module, call=_call(call))
        path = sub.save(plan.path, overwrite=overwrite, inputs=[model, hierarchy])
    if fmt == "json":
        click.echo(json.dumps({**sub.to_dict(), "output": str(path)}, indent=2))
        return 0
    lines = [
        f"extracted {sub.tag} -> {path}: {len(sub.operations)} nodes, {len(sub.initializers)} initializers",
        f"  inputs: {', '.join(sub.external_inputs)}",
        f"  outputs: {', '.join(sub.outputs)}",
        *(f"  note: {note}" for note in sub.notes),
    ]
    echo("\n".join(lines), more="--format json")
    return 0


@click.command("profile")
@_MODEL
@click.option("--runs", type=int, default=10, show_default=True, help="Timed runs (times are means per run).")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed runs first.")
@click.option("--ep", default=None, help="Execution providers, e.g. cuda,cpu (CPU is always last).")
@click.option(
    "--inputs",
    type=click.Path(),
    default=None,
    help=".npz with one array per model input (default: generated).",
)
@click.option(
    "--optimization",
    type=click.Choice(["disable", "basic", "extended", "all"]),
    default="basic",
    show_default=True,
    help="ORT graph optimization level; above basic, fused nodes may not map back to modules.",
)
@click.option(
    "--top-k", type=int, default=10, show_default=True, help="How many of the slowest nodes to list."
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None, help="Default text.")
@click.option(
    "--output",
    "-o",
    type=click.Path(),
    default=None,
    help="Write to FILE (.json for json), or into DIR/ as profile.txt|.json.",
)
@click.option(
    "--node-data",
    type=click.Path(),
    default=None,
    help="Also write a Model Explorer node-data overlay (.json): kernel time per node, summed per layer.",
)
@overwrite_option("-o and --node-data")
@_WIDE
def profile_cmd(
    model: str,
    runs: int,
    warmup: int,
    ep: str | None,
    inputs: str | None,
    optimization: str,
    top_k: int,
    fmt: str | None,
    output: str | None,
    node_data: str | None,
    overwrite: bool,
    wide: bool,
) -> int:
    """Where the time goes, per module: ORT's per-node profile joined with the hierarchy tags."""

    plan, fmt = _plan("profile", output, fmt, "text", [model, inputs], overwrite)
    node_plan = (
        plan_output(node_data, NODE_DATA_NAME, inputs=[model, inputs], overwrite=overwrite)
        if node_data
        else None
    )
    cfg = ProfileConfig(
        runs=runs, warmup=warmup, providers=ep or (), optimization=optimization, top_k=top_k, inputs=inputs
    )
    if Path(model).is_dir() and package_components(model) and not inputs:  # every graph of the package
        if node_plan is not None:
            raise ConfigError(
                "--node-data overlays one graph; pass the package's graph file",
                hint=f"e.g. {model}/GRAPH.onnx",
            )
        with progress(f"profile {model}: every graph, {warmup} warm-up and {runs} timed runs"):
            package_result = profile_package(model, cfg)
        _emit("profile_package", package_result, fmt, plan, wide)
        return 0
    with progress(f"profile {model}: {warmup} warm-up and {runs} timed runs"):
        result = profile(model, cfg)
    _emit("profile", result, fmt, plan, wide)
    if node_plan is not None:
        write_node_data(node_plan.path, profile_overlay(model, result))
        echo(f"wrote {node_plan.path}", err=True)
    return 0
