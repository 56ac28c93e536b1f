"""``modelexport.export``: load -> inputs -> reference run -> capture -> tag -> package steps -> write ->
verify -> sidecar, for each graph of the package.

The package steps (metadata, generation config, package files, embedding, optimized and quantized copies) are
:data:`~modelexport.export.package.PACKAGE_STEPS`, each a typed ``(ExportContext, PackageState) -> PackageState``.

One path for every model: the graph comes from a plain ``torch.onnx.export`` and tagging only adds
node ``metadata_props``, so the topology equals the baseline by construction (and
``verify_topology`` proves it). Output files are staged and moved into place only on success.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import onnx_weight_bytes, write_json, write_text
from ..errors import ConfigError, ExportError, InputSpecError, TopologyMismatchError, first_line
from ..hierarchy.scopes import scope_counts
from ..hierarchy.sidecar import build_sidecar
from ..hierarchy.tagger import tag_model
from ..hierarchy.tree import ModuleTree, TagRules
from ..metadata.package import GraphSet
from ..onnxfile import (
    DEFAULT_MODEL_FILE,
    EXTERNAL_DATA_THRESHOLD,
    PACKAGE_MANIFEST,
    OutputPlan,
    output_path,
    own_files,
    plan_output,
    sidecar_path_for,
    staged_output,
    variant_file,
)
from ..optimize.export_pass import package_variants
from .capture import CaptureSettings, capture, training_modes
from .config import ExportConfig
from .context import EXPORT_LOG, ExportContext, StageLog
from .device import check_device, place_inputs, place_model
from .experts import EXPERT_ROUTE, eager_experts, expert_blocks
from .free_axes import capture_graph
from .generation import CacheInputs, build_with_past_inputs, first_step_parity, is_with_past
from .inputs import ExampleInputs, build_inputs, input_specs_hint
from .loading import LoadedModel, load_model
from .package import PACKAGE_STEPS, PackageState, run_package_steps
from .parity import check_parity, flatten_outputs, output_names_for, runner_for
from .report import render_export_report
from .result import ExportResult
from .seq2seq import SEQ2SEQ_FILES, build_seq2seq_inputs, check_seq2seq_config, is_seq2seq_task
from .steps import StepInputs
from .topology import compare_topology
from .vlm import (
    VLM_HINT,
    build_vlm_inputs,
    check_vlm_config,
    is_vision_language_model,
    is_vlm_task,
    vlm_files,
)

if TYPE_CHECKING:
    import onnx
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["ExportResult", "export", "PACKAGE_STEPS", "MODEL_FILE", "PACKAGE_FILES_KEY"]

log = logging.getLogger(__name__)
MODEL_FILE = DEFAULT_MODEL_FILE
#: Where the sidecar's export settings list the files of the package.
PACKAGE_FILES_KEY = "package_files"
BF16_NOTE = (
    "bfloat16 graph: ONNX Runtime's CPU provider has no bfloat16 kernels, so parity ran on onnx's reference "
    "evaluator; serve it on a provider with bfloat16 kernels"
)


def _load_tokenizer(loaded: LoadedModel) -> PreTrainedTokenizerBase | None:
    if loaded.model_dir is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(loaded.model_dir), local_files_only=True)
    except Exception:  # noqa: BLE001 - models without a tokenizer are normal
        return None
    if loaded.sentence is not None and loaded.sentence.max_seq_length:  # sentence-transformers truncates here
        tokenizer.model_max_length = loaded.sentence.max_seq_length
    return tokenizer


def _reference_run(ctx: ExportContext) -> None:
    """Run PyTorch once: reference outputs for parity, and call counts for the module tree."""
    import torch

    module = ctx.loaded.module
    holder: dict[str, Any] = {}

    def run() -> None:
        with torch.no_grad(), training_modes(module, ctx.config.keep_dropout):
            holder["out"] = module(**ctx.inputs.forward_kwargs())

    try:
        ctx.tree.count_calls(module, run)
    except (TypeError, RuntimeError, ValueError, IndexError, AttributeError, KeyError) as exc:
        raise InputSpecError(
            f"{type(module).__name__}.forward() failed on the example inputs "
            f"({', '.join(f'{s.name} {list(s.shape)}' for s in ctx.inputs.specs)}): {exc}",
            hint=VLM_HINT if is_vision_language_model(module) else input_specs_hint(module, ctx.inputs.specs),
        ) from exc
    ctx.reference = flatten_outputs(holder["out"])
    if not ctx.reference:
        raise ExportError(f"{type(module).__name__}.forward() returned no tensors; nothing to export")


def _settings(ctx: ExportContext) -> CaptureSettings:
    c = ctx.config
    return CaptureSettings(
        c.exporter,
        c.opset,
        ctx.inputs.output_names or output_names_for(ctx.reference),
        c.static_shapes,
        c.keep_batchnorm,
        c.keep_dropout,
    )


def _dump_graphs(ctx: ExportContext) -> None:
    import torch

    module, kwargs = ctx.loaded.module, ctx.inputs.forward_kwargs()
    if ctx.config.fx_graph:
        with training_modes(module, ctx.config.keep_dropout):
            program = torch.export.export(module, (), kwargs=kwargs, strict=False)
        (ctx.staging_dir / "fx_graph.txt").write_text(str(program.graph), encoding="utf-8")
        ctx.files["fx_graph"] = "fx_graph.txt"
    if ctx.config.jit_graph:
        with training_modes(module, ctx.config.keep_dropout), torch.no_grad():
            traced = torch.jit.trace(
                module, example_kwarg_inputs=ctx.inputs.forward_kwargs(), strict=False, check_trace=False
            )
        (ctx.staging_dir / "jit_graph.txt").write_text(str(traced.inlined_graph), encoding="utf-8")
        ctx.files["jit_graph"] = "jit_graph.txt"


def _verify(
    ctx: ExportContext,
    settings: CaptureSettings,
    model: bytes | Path,
    copies: Mapping[str, tuple[float, int | None]],
) -> tuple[bool | None, dict[str, Any] | None]:
    """Topology (optional), onnx.checker and parity, on the serialized model (serialized once), and parity of
    ``copies`` (file name in the package -> tolerance and the example rows checked, None: all; the optimized
    graph)."""
    import onnx

    identical = None
    if ctx.config.verify_topology:
        with ctx.stages.stage("topology", "compare with a plain torch.onnx.export") as st:
            diff = compare_topology(ctx.model_proto, capture(ctx.loaded.module, ctx.inputs, settings))
            if not diff.identical:
                raise TopologyMismatchError(
                    "tagged graph differs from the baseline: " + "; ".join(diff.differences[:5])
                )
            identical, st["detail"] = True, "identical to baseline"
    with ctx.stages.stage("onnx_checker"):
        try:
            onnx.checker.check_model(model if isinstance(model, bytes) else str(model))
        except onnx.checker.ValidationError as exc:
            raise ExportError(f"the exported model fails onnx.checker: {first_line(exc)}") from exc
    if not ctx.config.validate:
        ctx.stages.skip("parity", "--no-validate")
        return identical, None
    if ctx.config.keep_dropout:
        ctx.stages.skip("parity", "dropout kept active: outputs are random by design")
        return identical, None
    cfg = ctx.config
    with ctx.stages.stage("parity") as st:
        report = check_parity(
            model,
            ctx.inputs.as_numpy(),
            ctx.reference,
            cfg.tolerance,
            runner_for(cfg.dtype),
            scaled=cfg.dtype != "float32",
        )
        st["detail"] = f"max abs diff {report.worst:.3g} <= {cfg.tolerance} ({cfg.dtype}, {report.provider})"
    parity = {**report.to_dict(), "dtype": cfg.dtype}
    for name, (atol, rows) in copies.items():  # e.g. the optimized, deployed graph
        feeds, reference = ctx.inputs.as_numpy(), ctx.reference
        if rows is not None:  # rows are independent: the first ``rows`` of the batch and of the outputs
            feeds, reference = {k: v[:rows] for k, v in feeds.items()}, [(n, t[:rows]) for n, t in reference]
        with ctx.stages.stage("parity", name) as st:
            other = check_parity(
                ctx.staging_dir / name,
                feeds,
                reference,
                atol,
                runner_for(cfg.dtype),
                scaled=cfg.dtype != "float32",
            )
            st["detail"] = f"{name}: max abs diff {other.worst:.3g} <= {atol}"
        parity.setdefault("files", {})[name] = other.to_dict()
    if isinstance(ctx.inputs, StepInputs) and ctx.inputs.checks:
        parity["checks"] = _check_examples(ctx, ctx.inputs, model)
    if isinstance(ctx.inputs, CacheInputs):
        with ctx.stages.stage("parity_first_step", "zero-length past") as st:
            parity["first_step"] = first_step_parity(
                ctx.inputs, ctx.loaded.module, cfg.tolerance, cfg.dtype, model
            )
            st["detail"] = f"max abs diff {max(parity['first_step']['max_abs_diff'].values()):.3g}"
    return identical, parity


def _check_examples(ctx: ExportContext, inputs: StepInputs, model: bytes | Path) -> dict[str, Any]:
    """Parity on each further example of a step (another image size, an empty past): PyTorch's outputs there
    (the step bound as forward) against the graph's, within the export's tolerance."""
    import torch

    cfg = ctx.config
    results: dict[str, Any] = {}
    for label, tensors in inputs.checks:
        other = inputs.with_tensors(tensors)
        with ctx.stages.stage("parity", label) as st, torch.no_grad():
            reference = flatten_outputs(ctx.loaded.module(**other.forward_kwargs()))
            report = check_parity(
                model,
                other.as_numpy(),
                reference,
                cfg.tolerance,
                runner_for(cfg.dtype),
                scaled=cfg.dtype != "float32",
            )
            st["detail"] = f"{label}: max abs diff {report.worst:.3g} <= {cfg.tolerance}"
        results[label] = report.to_dict()
    return results


def _write_model(proto: onnx.ModelProto, path: Path) -> bytes | Path:
    """Serialize once and write; returns the bytes (reused by checker and parity), or the path for
    models over protobuf's 2 GB limit, which are saved with external data."""
    import onnx

    if onnx_weight_bytes(proto) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(proto, str(path), save_as_external_data=True, location=f"{path.name}.data")
        return path
    data = proto.SerializeToString()
    path.write_bytes(data)
    return data


def export(
    model: torch.nn.Module | str | os.PathLike[str],
    output_dir: str | Path,
    config: ExportConfig | None = None,
    *,
    on_stage: Callable[[str], None] | None = None,
    **options: object,
) -> ExportResult:
    """Export ``model`` (nn.Module, HF folder or hub id, ``file.py:factory``) to ``output_dir``.

    Writes ``model.onnx`` (every node tagged) and ``model_hierarchy.json``; verifies with
    ``onnx.checker`` and ONNX Runtime vs PyTorch parity. Encoder-decoder ``*-with-past`` tasks write
    three graphs instead (:mod:`.seq2seq`), as do vision-language ``image-text-to-text`` tasks (:mod:`.vlm`), each tagged, checked and with its sidecar. ``output_dir``
    follows the one output rule (:mod:`modelexport.onnxfile.output`): a folder (``out/``, or any path
    not ending in ``.onnx``) gets the package, ``FILE.onnx`` is the model file with its package beside
    it; existing files are replaced only with ``overwrite`` and only when an earlier run of ours wrote
    them. ``options`` are :class:`ExportConfig` fields; ``on_stage`` is called with each stage's name as
    it starts (progress).
    """
    cfg = (config or ExportConfig()).with_changes(**options) if options else (config or ExportConfig())
    check_device(cfg.device)
    graph_files = _graph_files(cfg)
    plan = _plan(model, output_dir, cfg, graph_files)
    with staged_output(plan) as stage, contextlib.ExitStack() as scope:
        staging = stage.path
        stages = StageLog(on_stage=on_stage, logger=EXPORT_LOG)
        loaded, tokenizer, graphs = _prepare(model, cfg, stages, plan.name, scope)
        graph_set = _graph_set(cfg, [(_role(f, i), f) for f, i in graphs]) if len(graphs) > 1 else None
        results = []
        for file, inputs in graphs:
            log_ = stages if len(graphs) == 1 else StageLog(on_stage=on_stage, logger=EXPORT_LOG)
            ctx = ExportContext(cfg, loaded, inputs, None, staging, file, tokenizer=tokenizer, stages=log_)
            results.append(_export_graph(ctx, plan.folder, file, graph_set))
        result = results[0] if len(results) == 1 else _combined(results, stages)
    if stage.replaced or stage.removed:
        result.notes.append(
            f"--overwrite: replaced the earlier package's files in {plan.folder}"
            + (
                f"; removed those this export does not write: {', '.join(stage.removed)}"
                if stage.removed
                else ""
            )
        )
    return result


def _source_path(model: torch.nn.Module | str | os.PathLike[str]) -> str | None:
    """The file or folder a model given as a string is read from (``file.py:factory`` -> ``file.py``)."""
    if not isinstance(model, str | os.PathLike):
        return None
    text = os.fspath(model)
    return text if Path(text).exists() or ":" not in text else text.rsplit(":", 1)[0]


def _graph_files(cfg: ExportConfig) -> tuple[str, ...]:
    """The graphs of a multi-graph task (encoder-decoder, vision-language), in the order they run, its
    options checked; ``()`` for one graph."""
    if is_seq2seq_task(cfg):
        check_seq2seq_config(cfg)
        return SEQ2SEQ_FILES
    if is_vlm_task(cfg):
        check_vlm_config(cfg)
        return vlm_files(cfg)
    return ()


def _plan(
    model: torch.nn.Module | str | os.PathLike[str],
    output: str | Path,
    cfg: ExportConfig,
    graph_files: tuple[str, ...],
) -> OutputPlan:
    """Where the export writes (the one output rule), checked before any work. The files it will write
    besides the model's own are predicted here; one it could not predict is checked before it is moved."""
    main = graph_files[0] if graph_files else MODEL_FILE
    target, _ = output_path(output, main, bare_is_folder=True)
    graphs = list(graph_files) or [target.name]
    several = bool(graph_files)
    suffixes, _ = package_variants(cfg.optimize, cfg.quantize)
    files = [*graphs, *(variant_file(g, s) for g in graphs for s in suffixes)]
    package = [n for f in files for n in (f, sidecar_path_for(f).name) if n not in own_files(target.name)]
    if cfg.embed_metadata or suffixes or several:
        package.append(PACKAGE_MANIFEST)
    folder_or_hub_id = isinstance(model, str | os.PathLike) and ":" not in os.fspath(model)
    if folder_or_hub_id or hasattr(model, "config"):
        package.append("config.json")  # a Hugging Face model
    if cfg.processor_config:
        package.append("preprocessor_config.json")
    dumps = {
        "export_report.md": cfg.with_report,
        "fx_graph.txt": cfg.fx_graph,
        "jit_graph.txt": cfg.jit_graph,
    }
    package += [name for name, wanted in dumps.items() if wanted]
    plan = plan_output(
        output,
        main,
        inputs=[_source_path(model)],
        package=package,
        bare_is_folder=True,
        package_folder=True,
        overwrite=cfg.overwrite,
    )
    if several and not plan.is_folder:
        raise ConfigError(
            f"task {cfg.task} writes {len(graphs)} graphs ({', '.join(graphs)}); the output must "
            f"be a folder, not {plan.name}",
            hint=f"pass a folder: {plan.path.with_suffix('')}{os.sep}",
        )
    return plan


def _export_graph(ctx: ExportContext, output_dir: Path, file: str, graphs: GraphSet | None) -> ExportResult:
    """Reference run, capture, tags, package steps, write, verify and sidecar of one graph (of the package's
    ``graphs`` when it has several)."""
    cfg, module = ctx.config, ctx.loaded.module
    with ctx.inputs.bind(module):
        with ctx.stages.stage("reference_run", "PyTorch outputs and module call counts"):
            ctx.tree = ModuleTree(module, TagRules(cfg.torch_nn_exceptions, cfg.include_torch_nn))
            _reference_run(ctx)
        settings = _settings(ctx)
        capture_graph(ctx, settings)  # image height/width free where the model takes another size
        if expert_blocks(module):
            ctx.notes.append(EXPERT_ROUTE)
        if cfg.dtype == "bfloat16":
            ctx.notes.append(BF16_NOTE)
        if cfg.fx_graph or cfg.jit_graph:
            with ctx.stages.stage("graph_dumps"):
                _dump_graphs(ctx)
        with ctx.stages.stage("tagging") as st:
            ctx.tree.reveal(scope_counts(ctx.model_proto, cfg.exporter, set(ctx.tree.modules)))
            ctx.tagging = tag_model(ctx.model_proto, ctx.tree, cfg.exporter)
            st["detail"] = (
                f"{ctx.tagging.coverage['coverage_pct']}% of {ctx.tagging.coverage['total_nodes']} nodes"
            )
        state = PackageState(_settings_record(ctx), graphs, tuple(graphs.files()) if graphs else ())
        state = run_package_steps(ctx, state)
        with ctx.stages.stage("write", file):
            serialized = _write_model(ctx.model_proto, ctx.staging_dir / file)
        identical, parity = _verify(ctx, settings, serialized, state.parity_files)
    return _finish(ctx, output_dir, identical, parity, file, state)


def _prepare(
    model: torch.nn.Module | str | os.PathLike[str],
    cfg: ExportConfig,
    stages: StageLog,
    file: str,
    scope: contextlib.ExitStack,
) -> tuple[LoadedModel, PreTrainedTokenizerBase | None, list[tuple[str, ExampleInputs]]]:
    """The loaded model, its tokenizer and the graphs to write: (file name, example inputs) each; one graph
    is written as ``file``; ``scope`` holds the model's export-time settings (restored when the export ends)."""
    with stages.stage("load", f"{cfg.dtype} on {cfg.device}") as st:
        loaded = load_model(model, cfg.library)
        place_model(loaded.module, cfg)
        scope.enter_context(eager_experts(loaded.module))
        st["detail"] = f"{type(loaded.module).__name__}, {cfg.dtype} on {cfg.device}"
    with stages.stage("inputs") as st:
        tokenizer = _load_tokenizer(loaded) if cfg.text is not None or loaded.model_dir else None
        if is_seq2seq_task(cfg):
            graphs: list[tuple[str, ExampleInputs]] = [
                (i.file, place_inputs(i, cfg)) for i in build_seq2seq_inputs(loaded.module, cfg)
            ]
            st["detail"] = ", ".join(f for f, _ in graphs)
        elif is_vlm_task(cfg):
            graphs = [(i.file, place_inputs(i, cfg)) for i in build_vlm_inputs(loaded, cfg)]
            st["detail"] = ", ".join(f for f, _ in graphs)
        elif is_with_past(cfg):
            graphs = [(file, place_inputs(build_with_past_inputs(loaded.module, cfg), cfg))]
        else:
            graphs = [(file, place_inputs(build_inputs(loaded.module, cfg, tokenizer), cfg))]
    return loaded, tokenizer, graphs


def _role(file: str, inputs: ExampleInputs) -> str:
    """A graph's role in its package's manifest: what its inputs name, else its file stem (``encoder``...)."""
    return getattr(inputs, "role", "") or Path(file).stem.removesuffix("_model")


def _graph_set(cfg: ExportConfig, roles: list[tuple[str, str]]) -> GraphSet:
    """A multi-graph package's graphs as its manifest lists them: every graph by role (the first runs first),
    the copies ``--optimize`` / ``--quantize`` write of each, and the deployed entry (the optimized set's)."""
    graphs = dict(roles)
    suffixes, deployed = package_variants(cfg.optimize, cfg.quantize)
    variants = {s: {role: variant_file(f, s) for role, f in graphs.items()} for s in suffixes}
    return GraphSet(graphs, variants, variant_file(roles[0][1], deployed) if deployed else None)


def _combined(results: list[ExportResult], stages: StageLog) -> ExportResult:
    """One result for a multi-graph package: the first graph's paths, every graph's checks."""
    first, last = results[0], results[-1]
    total = sum(r.coverage["total_nodes"] for r in results)
    tagged = sum(r.coverage.get("tagged_nodes", 0) for r in results)
    parities = [r.parity for r in results if r.parity]
    parity = None
    if parities:
        parity = {
            "atol": parities[0]["atol"],
            "provider": parities[0]["provider"],
            "dtype": parities[0].get("dtype"),
            "passed": all(p["passed"] for p in parities),
            "max_abs_diff": {
                f"{r.onnx_path.name}:{k}": v
                for r in results
                if r.parity
                for k, v in r.parity["max_abs_diff"].items()
            },
        }
        files_parity = {n: f for p in parities for n, f in p.get("files", {}).items()}
        if files_parity:  # the optimized copies of the graphs
            parity["files"] = files_parity
    topology = [r.topology_identical for r in results]
    files = {k: v for k, v in last.files.items() if not _of_graph(v, last)}  # the package's shared files
    for r in results:  # each graph's own files (the graph, its sidecar, its copies), by stem
        files.update({Path(v).stem: v for v in r.files.values() if _of_graph(v, r)})
    return ExportResult(
        output_dir=first.output_dir,
        onnx_path=first.onnx_path,
        hierarchy_path=first.hierarchy_path,
        exporter=first.exporter,
        opset=first.opset,
        node_count=sum(r.node_count for r in results),
        coverage={
            "coverage_pct": min(r.coverage["coverage_pct"] for r in results),
            "total_nodes": total,
            "tagged_nodes": tagged,
        },
        parity=parity,
        topology_identical=None if None in topology else all(topology),
        stages=stages.stages + [{**s, "graph": r.onnx_path.name} for r in results for s in r.stages],
        files=files,
        notes=list(dict.fromkeys(n for r in results for n in r.notes)),
        package=last.package,
        components={r.onnx_path.name: r for r in results},
    )


def _of_graph(name: str, result: ExportResult) -> bool:
    """Whether ``name`` is one of the graph's own files: ``<stem>.onnx``, ``<stem>_hierarchy.json``, ``<stem>_O2.onnx``..."""
    stem = result.onnx_path.stem
    return name == result.onnx_path.name or name.startswith(f"{stem}_")


def _opset(proto: onnx.ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _settings_record(ctx: ExportContext) -> dict[str, Any]:
    """The export settings as recorded in the sidecar and the metadata."""
    cfg = ctx.config
    return {
        **cfg.to_dict(),
        "opset": _opset(ctx.model_proto),
        "input_names": ctx.inputs.names,
        "output_names": [o.name for o in ctx.model_proto.graph.output],
        "dynamic_axes": ctx.inputs.dynamic_axes(cfg.static_shapes),
        "input_specs": [s.to_dict() for s in ctx.inputs.specs],
    }


def _finish(
    ctx: ExportContext,
    output_dir: Path,
    identical: bool | None,
    parity: dict[str, Any] | None,
    file: str,
    state: PackageState,
) -> ExportResult:
    cfg = ctx.config
    opset = _opset(ctx.model_proto)
    sidecar_name = sidecar_path_for(file).name
    package_files = sorted(
        {file, sidecar_name, *ctx.files.values(), *(["export_report.md"] if cfg.with_report else [])}
        | set(state.files)
        | {p.name for p in ctx.staging_dir.iterdir() if p.name.startswith(file)}
    )
    state = replace(state, settings={**state.settings, PACKAGE_FILES_KEY: package_files})
    with ctx.stages.stage("sidecar", sidecar_name):
        sidecar = build_sidecar(ctx.model_proto, ctx.tree, ctx.tagging, state.settings, ctx.loaded.info())
        write_json(ctx.staging_dir / sidecar_name, sidecar)
    result = ExportResult(
        output_dir=output_dir,
        onnx_path=output_dir / file,
        hierarchy_path=output_dir / sidecar_name,
        exporter=cfg.exporter,
        opset=opset,
        node_count=len(ctx.model_proto.graph.node),
        coverage=ctx.tagging.coverage,
        parity=parity,
        topology_identical=identical,
        stages=ctx.stages.stages,
        files={"model": file, "hierarchy": sidecar_name, **ctx.files},
        notes=ctx.notes,
        package=state,
    )
    if cfg.with_report:
        write_text(ctx.staging_dir / "export_report.md", render_export_report(result, ctx.loaded.info()))
        result.files["report"] = "export_report.md"
    return result
