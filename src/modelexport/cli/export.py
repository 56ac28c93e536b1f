"""``modelexport export MODEL OUTPUT``: parse options, call :func:`modelexport.export`, print a summary."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ..export import ExportConfig, export, load_input_specs
from .display import diff, echo, progress
from .options import OptionValue, overwrite_option

if TYPE_CHECKING:
    from ..export.result import ExportResult

__all__ = ["export_cmd"]


def _shape(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(v) for v in value.replace("x", ",").split(",") if v.strip())
    except ValueError as exc:
        raise click.BadParameter(f"expected integers like 2,16 or 1,3,224,224, got {value!r}") from exc


def _coverage(cov: dict[str, Any], graph: str = "") -> str:
    sources = ", ".join(f"{k} {v}" for k, v in sorted(cov["by_source"].items()))
    modules = cov.get("modules", cov["unique_tags"])  # counted as analyze and report count them
    return f"  hierarchy tags{graph}: {cov['coverage_pct']}% of nodes ({sources}), {modules} modules"


def _summary(result: ExportResult) -> str:
    graphs = result.components or {result.onnx_path.name: result}
    lines = [
        f"Exported {result.onnx_path} ({result.exporter}, opset {result.opset}, {result.node_count} nodes)",
        *(_coverage(g.coverage, f" ({name})" if result.components else "") for name, g in graphs.items()),
    ]
    if result.topology_identical is not None:
        lines.append("  topology: identical to plain torch.onnx.export")
    if result.parity:
        diffs = ", ".join(f"{k} {diff(v)}" for k, v in result.parity["max_abs_diff"].items())
        p = result.parity
        atol = f"atol {p['atol']}" + (" x max(1, |output|)" if "bound" in p else "")
        lines.append(f"  parity vs PyTorch ({p.get('dtype', 'float32')}, {atol}, {p['provider']}): {diffs}")
        for name, other in p.get("files", {}).items():
            diffs = ", ".join(f"{k} {diff(v)}" for k, v in other["max_abs_diff"].items())
            lines.append(f"  parity of {name} vs PyTorch (atol {other['atol']:g}): {diffs}")
    lines.append("  files: " + ", ".join(sorted(result.files.values())))
    lines += [f"  note: {n}" for n in result.notes]
    return "\n".join(lines)


@click.command("export")
@click.argument("model")
@click.argument("output", type=click.Path())
@click.option(
    "--exporter",
    type=click.Choice(["dynamo", "torchscript"]),
    default="dynamo",
    show_default=True,
    help="torch.onnx exporter; tags come from its own scope information.",
)
@click.option("--opset", type=int, default=None, help="ONNX opset version (default: the exporter's).")
@click.option(
    "--input-specs",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help='JSON file: {"inputs": [{"name": "x", "shape": [2, 1, 8, 8], "dtype": "float32"}]}, optional '
    '"dynamic_axes" {"0": "batch"} (default: axis 0 dynamic; {} for static) and "range" [low, high] per '
    "input. Names are the ONNX input names; names that are not forward()'s parameters map onto them by position.",
)
@click.option(
    "--input-shape", default=None, help="Shape of the main input, e.g. 2,16 (batch,seq) or 1,3,224,224."
)
@click.option(
    "--text", default=None, help="Example text, tokenized with the model's tokenizer, as export input."
)
@click.option("--static-shapes", is_flag=True, help="Fix every input axis (no dynamic batch/sequence axes).")
@click.option(
    "--torch-nn-exceptions",
    default=None,
    help="Comma list of torch.nn classes (globs) kept as tag levels "
    "[default: LayerNorm,Embedding,BatchNorm*,GroupNorm,InstanceNorm*].",
)
@click.option("--include-torch-nn", is_flag=True, help="Make every torch.nn module a tag level.")
@click.option(
    "--verify-topology",
    is_flag=True,
    help="Also run a plain torch.onnx.export and require an identical graph.",
)
@click.option(
    "--atol",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Max abs diff allowed, ONNX vs PyTorch [default: 1e-4 for fp32, 2e-2 for fp16, 1e-1 for bf16].",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default="fp32",
    show_default=True,
    help="Cast the model's weights (and float inputs) before capture; parity is checked in that dtype "
    "(bf16 on onnx's reference evaluator: ONNX Runtime's CPU provider has no bf16 kernels).",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Where PyTorch runs the model for capture and reference outputs: cpu, cuda or cuda:N.",
)
@click.option(
    "--library",
    type=click.Choice(["auto", "transformers", "sentence-transformers"]),
    default="auto",
    show_default=True,
    help="How to read a model folder: auto exports a sentence-transformers folder (modules.json) as its "
    "full embedding model (token_embeddings + pooled sentence_embedding); transformers: the transformer alone.",
)
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs PyTorch parity check.")
@click.option("--with-report", is_flag=True, help="Write export_report.md (stages, times, coverage, parity).")
@click.option("--jit-graph", is_flag=True, help="Write the TorchScript graph text to jit_graph.txt.")
@click.option("--fx-graph", is_flag=True, help="Write the torch.export FX graph text to fx_graph.txt.")
@click.option(
    "--keep-batchnorm", is_flag=True, help="Keep BatchNormalization nodes (needed for BN adaptation)."
)
@click.option(
    "--keep-dropout", is_flag=True, help="Export Dropout active (Monte-Carlo dropout); skips parity."
)
@click.option(
    "--task",
    default=None,
    help="Pipeline task to embed (default: detected from the model); text-generation-with-past exports a"
    " decoder that takes and returns its key/value cache; text2text-generation-with-past and"
    " automatic-speech-recognition-with-past export an encoder-decoder as encoder_model.onnx,"
    " decoder_model.onnx and decoder_with_past_model.onnx (Optimum's layout).",
)
@click.option("--no-embed-metadata", is_flag=True, help="Do not embed config/processor/task metadata.")
@click.option(
    "--quantize",
    type=click.Choice(["none", "dynamic", "static"]),
    default="none",
    show_default=True,
    help="Also write an int8 model beside model.onnx (from the optimized graph with --optimize); for an "
    "encoder-decoder task, each graph's <stem>_dynamic.onnx (static is refused there: no decoder calibration).",
)
@click.option(
    "--optimize",
    type=click.Choice(["O1", "O2", "O3", "O4"]),
    default=None,
    help="Also write model_<level>.onnx, optimized like `modelexport optimize -O<n>` (O2: transformer "
    "fusions), checked against PyTorch and recorded as the deployed model of the package; for an "
    "encoder-decoder task, each graph's <stem>_<level>.onnx, the set the pipelines load.",
)
@overwrite_option(
    "OUTPUT",
    "A folder's earlier package is replaced: its recorded files this export does not write are removed.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)
def export_cmd(model: str, output: str, **opts: OptionValue) -> int:
    """Export MODEL (HF folder, hub id, file.py:factory or package.module:factory) to OUTPUT with hierarchy tags.

    OUTPUT is a folder (out/, or any path not ending in .onnx) that gets model.onnx, where every node
    carries the module that produced it, model_hierarchy.json and the package files; or FILE.onnx, with
    its sidecar and package files beside it (in a new or empty folder). An existing file is never
    replaced without --overwrite. Checks the model with onnx.checker and ONNX Runtime vs PyTorch.
    """

    fmt = opts.pop("fmt")
    config = ExportConfig(
        exporter=opts["exporter"],
        opset=opts["opset"],
        static_shapes=opts["static_shapes"],
        input_specs=load_input_specs(opts["input_specs"]) if opts["input_specs"] else None,
        input_shape=_shape(opts["input_shape"]),
        text=opts["text"],
        include_torch_nn=opts["include_torch_nn"],
        validate=not opts["no_validate"],
        atol=opts["atol"],
        verify_topology=opts["verify_topology"],
        with_report=opts["with_report"],
        jit_graph=opts["jit_graph"],
        fx_graph=opts["fx_graph"],
        keep_batchnorm=opts["keep_batchnorm"],
        keep_dropout=opts["keep_dropout"],
        embed_metadata=not opts["no_embed_metadata"],
        task=opts["task"],
        quantize=None if opts["quantize"] == "none" else opts["quantize"],
        optimize=opts["optimize"],
        overwrite=opts["overwrite"],
        dtype=opts["dtype"],
        device=opts["device"],
        library=opts["library"],
        **(
            {"torch_nn_exceptions": opts["torch_nn_exceptions"]}
            if opts["torch_nn_exceptions"] is not None
            else {}
        ),
    )
    with progress(f"export {model}"):
        result = export(model, output, config)
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        echo(_summary(result), more="--format json")
    return 0
