"""``modelexport quantize`` and ``modelexport optimize``: parse options, call the library, print a summary."""

from __future__ import annotations

import json
from typing import Any

import click

__all__ = ["quantize_cmd", "optimize_cmd"]


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def quantize_summary(result: Any) -> str:
    """Size, coverage, nodes quantized per module, evaluation and error report as text."""
    cov = result.coverage
    lines = [
        f"Quantized ({result.config.mode}) {result.input_path} -> {result.output_path}",
        f"  size: {_mb(result.size_before)} -> {_mb(result.size_after)} ({result.size_ratio}x smaller)",
        f"  nodes: {result.nodes_before} -> {result.nodes_after}; hierarchy tags on {cov['coverage_pct']}% "
        f"({', '.join(f'{k} {v}' for k, v in sorted(result.retag.get('by_rule', {}).items()))})",
    ]
    if result.excluded_nodes:
        lines.append(f"  kept in float (--exclude-modules): {len(result.excluded_nodes)} nodes")
    if result.calibration:
        c = result.calibration
        lines.append(f"  calibration: {c['samples']} samples ({c['kind']}), method {c['method']}")
    lines.append("  nodes quantized per module:")
    lines += [f"    {module}: {n}" for module, n in result.quantized_per_module.items()] or ["    (none)"]
    if result.evaluation:
        e = result.evaluation
        parts = [f"cosine {e['mean_cosine']:.5f}", f"max abs diff {e['max_abs_diff']:.3g}"]
        if "agreement" in e:
            parts.insert(0, f"agreement {e['agreement']:.1%}")
        if "accuracy_fp32" in e:
            parts.insert(1, f"accuracy fp32 {e['accuracy_fp32']:.1%} -> int8 {e['accuracy_quantized']:.1%}")
        lines.append(f"  eval on {e['samples']} samples: " + ", ".join(parts))
        lines.append(
            f"  latency (batch 1): {e['latency_fp32_ms']} ms -> {e['latency_quantized_ms']} ms ({e['speedup']}x)"
        )
    if result.error_report:
        lines.append("  per-module output error (int8 vs fp32), worst first:")
        lines += [
            f"    {r['module']}: max {r['max_abs_error']:.3g}, mean {r['mean_abs_error']:.3g}"
            for r in result.error_report
        ]
    if result.sidecar_path:
        lines.append(f"  sidecar: {result.sidecar_path}")
    lines += [f"  note: {n}" for n in result.notes]
    return "\n".join(lines)


@click.command("quantize")
@click.argument("model", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .onnx file.")
@click.option(
    "--mode",
    type=click.Choice(["dynamic", "static"]),
    default="dynamic",
    show_default=True,
    help="dynamic: int8 weights, activations at run time; static: QDQ int8 calibrated on --calibration-data.",
)
@click.option(
    "--calibration-data",
    type=click.Path(),
    default=None,
    help="Dataset (as for training/evaluate; labels optional, words or ids): text CSV/TSV/JSON/JSONL "
    "(model's tokenizer, padded per batch), an image folder (its image processor) or a .npz "
    "('x', or arrays named after the model's inputs).",
)
@click.option(
    "--calibration-samples", type=int, default=100, show_default=True, help="Samples used to calibrate."
)
@click.option(
    "--calibrate-method",
    type=click.Choice(["minmax", "entropy", "percentile"]),
    default="minmax",
    show_default=True,
    help="How activation ranges are computed from the calibration data (static mode).",
)
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder with the tokenizer/processor (default: beside the model, or the exported source folder).",
)
@click.option("--per-channel", is_flag=True, help="One scale per output channel of each weight.")
@click.option(
    "--weight-type",
    type=click.Choice(["int8", "uint8"]),
    default="int8",
    show_default=True,
    help="Integer type of quantized weights.",
)
@click.option(
    "--activation-type",
    type=click.Choice(["int8", "uint8"]),
    default="int8",
    show_default=True,
    help="Integer type of quantized activations (static mode).",
)
@click.option(
    "--op-types", default=None, help="Comma list of op types to quantize (default: all ORT supports)."
)
@click.option(
    "--exclude-modules",
    multiple=True,
    help="Glob on hierarchy tags kept in float, e.g. '*/BertEmbeddings*' or '*LayerNorm*' (repeatable).",
)
@click.option(
    "--no-preprocess", is_flag=True, help="Skip quant_pre_process (shape inference + basic optimization)."
)
@click.option(
    "--eval-data",
    type=click.Path(),
    default=None,
    help="Dataset to compare int8 vs fp32 (agreement; accuracy when it has labels, words or ids; "
    "latency). Same formats as --calibration-data.",
)
@click.option(
    "--eval-samples",
    type=int,
    default=200,
    show_default=True,
    help="Samples of --eval-data used for the int8 vs fp32 comparison.",
)
@click.option(
    "--error-report",
    is_flag=True,
    help="Per top-level module: max/mean abs error of its outputs, int8 vs fp32.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)
def quantize_cmd(model: str, output: str, **opts: Any) -> int:
    """int8-quantize MODEL; hierarchy tags, metadata and the sidecar are carried to the output."""
    from ..optimize.config import QuantizeConfig
    from ..optimize.quantization import quantize

    fmt = opts.pop("fmt")
    run = {k: opts.pop(k) for k in ("eval_data", "eval_samples", "error_report")}
    opts["preprocess"] = not opts.pop("no_preprocess")
    opts["exclude_modules"] = tuple(opts["exclude_modules"])
    opts["progress"] = fmt == "text"
    result = quantize(model, output, QuantizeConfig(**opts), **run)
    click.echo(
        json.dumps(result.to_dict(), indent=2, default=str) if fmt == "json" else quantize_summary(result)
    )
    return 0


def optimize_summary(result: Any) -> str:
    lines = [
        f"Optimized {result.input_path} -> {result.output_path}",
        f"  size: {_mb(result.size_before)} -> {_mb(result.size_after)}; hierarchy tags on {result.coverage['coverage_pct']}%",
    ]
    for p in result.passes:
        stats = ", ".join(f"{k} {v}" for k, v in p.stats.items() if k not in ("warning", "note"))
        lines.append(f"  {p.name}: {p.nodes_before} -> {p.nodes_after} nodes ({stats})")
        lines += [f"    {k}: {p.stats[k]}" for k in ("warning", "note") if k in p.stats]
    if result.op_changes:
        lines.append("  op changes: " + ", ".join(f"{op} {n:+d}" for op, n in result.op_changes.items()))
    return "\n".join(lines)


@click.command("optimize")
@click.argument("model", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output .onnx file.")
@click.option(
    "--level",
    type=click.Choice(["none", "basic", "extended", "all"]),
    default="extended",
    show_default=True,
    help="ONNX Runtime offline graph optimization level ('all' is specific to this CPU).",
)
@click.option(
    "--transformer-fusion", is_flag=True, help="Attention/LayerNorm/GELU fusions (onnxruntime.transformers)."
)
@click.option(
    "--model-type",
    default=None,
    help="ORT fusion family for --transformer-fusion (bert, gpt2, bart, vit...; default: the embedded "
    "config's model_type when ORT knows it, else bert).",
)
@click.option(
    "--num-heads",
    type=int,
    default=None,
    help="Attention heads (default: from the embedded config, else detected).",
)
@click.option(
    "--hidden-size",
    type=int,
    default=None,
    help="Hidden size (default: from the embedded config, else detected).",
)
@click.option("--fp16", is_flag=True, help="Convert to float16 (for GPUs; slower on CPU).")
@click.option("--simplify", is_flag=True, help="Simplify with onnxslim.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)
def optimize_cmd(model: str, output: str, fmt: str, **opts: Any) -> int:
    """Optimize MODEL's graph; fused nodes are tagged with the common module of what they replaced."""
    from ..optimize.config import OptimizeConfig
    from ..optimize.graph import optimize_model

    result = optimize_model(model, output, OptimizeConfig(**opts))
    click.echo(
        json.dumps(result.to_dict(), indent=2, default=str) if fmt == "json" else optimize_summary(result)
    )
    return 0
