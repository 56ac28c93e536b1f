"""``modelexport quantize`` and ``modelexport optimize``: parse options, call the library, print a summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..inspect.node_data import NODE_DATA_NAME, error_overlay, write_node_data
from ..onnxfile import plan_output
from ..optimize.advice import quantization_advice
from ..optimize.config import (
    ACCURACY_LEVELS,
    BLOCK_SIZES,
    CALIBRATE_METHODS,
    FUSION_ENGINES,
    MIXED_PRECISION,
    OPTIMIZE_PRESETS,
    QUANT_MODES,
    WEIGHT_ALGORITHMS,
    WEIGHT_BITS,
    WEIGHT_PRESETS,
    WEIGHT_TYPES,
    OptimizeConfig,
    QuantizeConfig,
    WeightOnlyConfig,
    quantize_config,
)
from ..optimize.graph import OptimizeResult, optimize_model
from ..optimize.package import PackageResult
from ..optimize.quantization import QuantizeResult, quantize
from ..runtime.session import GRAPH_LEVEL_ALIASES, GRAPH_LEVELS
from .display import echo, message, progress
from .options import OptionValue, overwrite_option

__all__ = ["quantize_cmd", "optimize_cmd"]

#: One graph's result: a summary function prints one kind.
_Result = TypeVar("_Result", QuantizeResult, OptimizeResult)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def package_summary(
    result: PackageResult, summary: Callable[[QuantizeResult], str] | Callable[[OptimizeResult], str]
) -> str:
    """Each graph's summary (``summary(result)``) under one line for the package."""
    verb = {"quantize": "Quantized", "optimize": "Optimized"}[result.kind]
    lines = [f"{verb} the {len(result.components)} graphs of {result.input_dir} -> {result.output_dir}"]
    for role, graph in result.components.items():
        lines.append(f"  {role}:")
        lines += [f"    {line}" for line in summary(graph).splitlines()]
    lines.append(f"  package: {', '.join(result.files)}")
    return "\n".join(lines)


def _print(result: _Result | PackageResult, fmt: str, summary: Callable[[_Result], str]) -> None:
    """The summary (text fitted to the terminal, or JSON), and one warning line when --eval-data found the
    quantized model poor (``advice`` in JSON)."""
    advice = quantization_advice(getattr(result, "evaluation", None), getattr(result, "config", None))
    if fmt == "json":
        doc = result.to_dict()
        click.echo(json.dumps({**doc, "advice": advice} if advice else doc, indent=2, default=str))
        return
    echo(
        package_summary(result, summary) if isinstance(result, PackageResult) else summary(result),
        more="--format json",
    )
    if advice:
        click.secho(message(f"Warning: {advice}"), fg="yellow", err=True)


def quantize_summary(result: QuantizeResult) -> str:
    """Size, coverage, nodes quantized per module, evaluation and error report as text."""
    cov = result.coverage
    lines = [
        f"Quantized ({result.config.mode}) {result.input_path} -> {result.output_path}",
        f"  size: {_mb(result.size_before)} -> {_mb(result.size_after)} ({result.size_ratio}x smaller)",
        f"  nodes: {result.nodes_before} -> {result.nodes_after}; hierarchy tags on {cov['coverage_pct']}% "
        f"({', '.join(f'{k} {v}' for k, v in sorted(result.retag.get('by_rule', {}).items()))})",
    ]
    if isinstance(result.config, WeightOnlyConfig):
        lines.append(f"  weights: {weight_only_line(result.config)}")
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


def weight_only_line(cfg: WeightOnlyConfig) -> str:
    """One line for a weight-only run's settings."""
    parts = [
        f"{cfg.weights} {cfg.algorithm}",
        f"block {cfg.block_size}",
        "symmetric" if cfg.symmetric else "asymmetric",
        f"compute {ACCURACY_LEVELS[cfg.accuracy_level]}",
        "LM head quantized" if cfg.quantize_lm_head else "LM head float",
    ]
    if cfg.quantize_embeddings:
        parts.append("embeddings quantized")
    return ", ".join(parts)


#: -o of both commands: a file, or a folder (for a package of several graphs, a folder).
_OUTPUT = click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(),
    help="FILE.onnx (its sidecar, and the package files it needs in another folder, beside it), or a folder "
    "(DIR/, or any path not ending in .onnx) that gets model.onnx and the package files; a multi-graph package "
    "(encoder-decoder) needs a folder and gets every graph under its exported name. Never the input, never over "
    "an existing file without --overwrite.",
)


@click.command("quantize")
@click.argument("model", type=click.Path())
@_OUTPUT
@click.option(
    "--preset",
    type=click.Choice([*QuantizeConfig.preset_names(), *WEIGHT_PRESETS]),
    default=None,
    help="Start from a named config: a mode, a CPU target (arm64, avx2, avx512, avx512_vnni; like Optimum's "
    "AutoQuantizationConfig) or tensorrt, or a weight-only one (int4: onnxruntime-genai's CPU format; int8; "
    "int4_hqq; int4_gptq); the options below override it.",
)
@click.option(
    "--weights",
    type=click.Choice(list(WEIGHT_BITS)),
    default=None,
    help="Weight-only quantization: MatMul weights to int4/int8 blocks (ONNX Runtime's MatMulNBits), activations "
    "float; the LM head too, embeddings with --quantize-embeddings. Written with its weights in <model>.data.",
)
@click.option(
    "--block-size",
    type=int,
    default=None,
    show_default="32",
    help="Weight-only: weights per block along the input axis (one scale per block and output column): "
    + ", ".join(map(str, BLOCK_SIZES))
    + ".",
)
@click.option(
    "--accuracy-level",
    type=int,
    default=None,
    show_default="4",
    help="Weight-only: the type activations are computed in: "
    + ", ".join(f"{k} {v}" for k, v in ACCURACY_LEVELS.items())
    + " (4: int8 on the fly, the fast CPU path).",
)
@click.option(
    "--symmetric/--asymmetric",
    default=None,
    show_default="the algorithm's (rtn, gptq: symmetric; hqq: asymmetric)",
    help="Weight-only: blocks without (symmetric) or with a zero point.",
)
@click.option(
    "--algorithm",
    type=click.Choice(list(WEIGHT_ALGORITHMS)),
    default=None,
    show_default="rtn",
    help="Weight-only: "
    + "; ".join(f"{name}: {algo.summary}" for name, algo in WEIGHT_ALGORITHMS.items())
    + " (needs --calibration-data texts).",
)
@click.option(
    "--quantize-lm-head/--no-quantize-lm-head",
    default=None,
    show_default="quantized",
    help="Weight-only: whether the LM head (the MatMul that writes logits) is quantized too.",
)
@click.option(
    "--quantize-embeddings",
    is_flag=True,
    help="Weight-only int4: token embedding tables too (GatherBlockQuantized; rtn only).",
)
@click.option(
    "--mixed-precision",
    type=click.Choice(list(MIXED_PRECISION)),
    default=None,
    show_default="auto",
    help="Weight-only int4: which weights stay int8: "
    + "; ".join(f"{name}: {what}" for name, what in MIXED_PRECISION.items())
    + ".",
)
@click.option(
    "--no-fuse-projections",
    is_flag=True,
    help="Weight-only: keep an attention's q/k/v (an MLP's gate/up) as separate MatMuls instead of one.",
)
@click.option(
    "--mode",
    type=click.Choice(list(QUANT_MODES)),
    default=None,
    show_default="dynamic",
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
    "--calibration-samples",
    type=int,
    default=None,
    show_default="100 (static), 32 (gptq)",
    help="Samples used to calibrate.",
)
@click.option(
    "--calibrate-method",
    type=click.Choice(list(CALIBRATE_METHODS)),
    default=None,
    show_default="minmax",
    help="How activation ranges are computed from the calibration data (static mode).",
)
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder with the tokenizer/processor (default: beside the model, or the exported source folder).",
)
@click.option(
    "--per-channel/--no-per-channel",
    default=None,
    show_default="per tensor",
    help="One scale per output channel of each weight.",
)
@click.option(
    "--reduce-range/--no-reduce-range",
    default=None,
    show_default="off",
    help="7-bit weights (for CPUs without VNNI, where 8-bit products can saturate).",
)
@click.option(
    "--weight-type",
    type=click.Choice(list(WEIGHT_TYPES)),
    default=None,
    show_default="int8",
    help="Integer type of quantized weights.",
)
@click.option(
    "--activation-type",
    type=click.Choice(list(WEIGHT_TYPES)),
    default=None,
    show_default="int8",
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
    "--node-data",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --error-report: write a Model Explorer node-data overlay (.json) of each module's error.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)
@overwrite_option("-o (and --node-data)")
def quantize_cmd(model: str, output: str, preset: str | None, overwrite: bool, **opts: OptionValue) -> int:
    """Quantize MODEL (int8, or weight-only int4/int8 with --weights); hierarchy tags, metadata and the sidecar
    are carried to the output.

    MODEL is a .onnx file or a package folder; an encoder-decoder package (three graphs) is quantized
    graph by graph (dynamic mode, or weight-only rtn/hqq) into the folder -o, a complete package.
    A model ONNX Runtime cannot load, metadata whose checksum or sidecar does not verify, and data files
    (--eval-data, --calibration-data) that do not fit the model are refused before anything is written.
    """
    fmt = opts.pop("fmt")
    node_data = opts.pop("node_data")
    if node_data and not opts["error_report"]:
        raise click.UsageError("--node-data writes the error report's overlay; add --error-report")
    node_plan = (
        plan_output(node_data, NODE_DATA_NAME, inputs=[model], overwrite=overwrite) if node_data else None
    )
    run = {k: opts.pop(k) for k in ("eval_data", "eval_samples", "error_report")}
    opts["preprocess"] = False if opts.pop("no_preprocess") else None
    opts["fuse_projections"] = False if opts.pop("no_fuse_projections") else None
    opts["quantize_embeddings"] = True if opts["quantize_embeddings"] else None
    opts["exclude_modules"] = tuple(opts["exclude_modules"]) or None
    config = quantize_config(preset, **opts)
    config = config.with_changes(progress=fmt == "text")
    with progress(f"quantize {model}", spinner=False):
        result = quantize(model, output, config, overwrite=overwrite, **run)
    if node_plan is not None:
        write_node_data(node_plan.path, error_overlay(result.output_path, result.error_report or []))
    _print(result, fmt, quantize_summary)
    return 0


#: Pass statistics printed on lines of their own (the rest go on the pass's line).
_OWN_LINE = ("warning", "note", "matched", "fused")


def _fusion_lines(stats: dict[str, Any]) -> list[str]:
    """Patterns matched per fusion, and why a set of fusions was rejected."""
    lines = []
    for key, label in (("matched", "patterns matched"), ("fused", "ORT fused operators")):
        if key in stats:
            lines.append(f"    {label}: " + (", ".join(f"{k} {v}" for k, v in stats[key].items()) or "none"))
    for name, why in stats.get("onnxscript", {}).get("rejected", {}).items():
        lines.append(f"    rejected ({name} fusions): {why}")
    if split := stats.get("skip_layer_norm"):
        lines.append(
            f"    skip normalizations split into Add + normalization for the CPU: {split['split_for_cpu']}"
            + (
                f" (kept fused: {split['kept']}, their mean/inv-std outputs are read)"
                if split["kept"]
                else ""
            )
        )
    return lines


def optimize_summary(result: OptimizeResult) -> str:
    lines = [
        f"Optimized {result.input_path} -> {result.output_path}",
        f"  size: {_mb(result.size_before)} -> {_mb(result.size_after)}; hierarchy tags on {result.coverage['coverage_pct']}%",
    ]
    for p in result.passes:
        pass_stats = p.record.get("stats", {})
        stats = ", ".join(
            f"{k} {v}" for k, v in pass_stats.items() if k not in _OWN_LINE and not isinstance(v, dict)
        )
        lines.append(f"  {p.name}: {p.nodes_before} -> {p.nodes_after} nodes ({stats})")
        lines += [f"    {k}: {pass_stats[k]}" for k in ("warning", "note") if k in pass_stats]
        lines += _fusion_lines(pass_stats)
    if result.op_changes:
        lines.append("  op changes: " + ", ".join(f"{op} {n:+d}" for op, n in result.op_changes.items()))
    return "\n".join(lines)


@click.command("optimize")
@click.argument("model", type=click.Path())
@_OUTPUT
@click.option(
    "--preset",
    type=click.Choice(list(OPTIMIZE_PRESETS)),
    default=None,
    help="Optimization level like Optimum's: O1 basic graph optimizations; O2 extended + transformer "
    "fusions; O3 + approximate Gelu; O4 + float16 (GPU). The options below add to it.",
)
@click.option("-O1", "preset", flag_value="O1", help="Same as --preset O1.")
@click.option("-O2", "preset", flag_value="O2", help="Same as --preset O2.")
@click.option("-O3", "preset", flag_value="O3", help="Same as --preset O3.")
@click.option("-O4", "preset", flag_value="O4", help="Same as --preset O4.")
@click.option(
    "--level",
    type=click.Choice([*GRAPH_LEVELS, *GRAPH_LEVEL_ALIASES]),
    default=None,
    show_default="extended",
    help="ONNX Runtime offline graph optimization level ('none' = 'disable'; 'all' is specific to this CPU).",
)
@click.option(
    "--transformer-fusion",
    is_flag=True,
    help="Attention/MultiHeadAttention/GQA, SkipLayerNorm, RMSNorm, BiasGelu fusions, checked against the "
    "unfused graph on a padded batch (fusions that change outputs are dropped and reported).",
)
@click.option(
    "--fusion-engine",
    type=click.Choice(FUSION_ENGINES),
    default=None,
    show_default="auto",
    help="auto: onnxscript's rewriter (made for dynamo graphs), then ONNX Runtime's transformer optimizer "
    "only for FastGelu or when onnxscript matched nothing (TorchScript graphs); onnxscript / ort: that one.",
)
@click.option(
    "--approximate-gelu",
    is_flag=True,
    help="With --transformer-fusion: Gelu -> FastGelu (tanh approximation).",
)
@click.option(
    "--model-type",
    default=None,
    help="ORT fusion family when ONNX Runtime's transformer optimizer runs (bert, gpt2, bart, vit...; "
    "default: the embedded config's model_type when ORT knows it, else bert).",
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
@click.option(
    "--skip-norm-fusion",
    is_flag=True,
    help="Keep SkipLayerNormalization / SkipSimplifiedLayerNormalization fused (for GPUs; -O4 sets it). "
    "Without it each is split into Add + its normalization, which ONNX Runtime's CPU provider runs faster "
    "(a graph with a key/value cache keeps the RMS form: faster on its one-token steps).",
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
@overwrite_option("-o")
def optimize_cmd(
    model: str, output: str, fmt: str, preset: str | None, overwrite: bool, **opts: OptionValue
) -> int:
    """Optimize MODEL's graph; fused nodes are tagged with the common module of what they replaced.

    MODEL is a .onnx file or a package folder; an encoder-decoder package (three graphs) is optimized
    graph by graph into the folder -o, a complete package. A model ONNX Runtime cannot load and metadata
    whose checksum or sidecar does not verify are refused before anything is written.
    """
    base = OptimizeConfig.preset(preset) if preset else OptimizeConfig()
    config = base.with_changes(**{k: v for k, v in opts.items() if v is not None and v is not False})
    with progress(f"optimize {model}"):
        result = optimize_model(model, output, config, overwrite=overwrite)
    _print(result, fmt, optimize_summary)
    return 0
