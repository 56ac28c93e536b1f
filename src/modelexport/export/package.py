"""The package steps of one graph, in order: :data:`PACKAGE_STEPS`.

Each step reads the export's context and :class:`PackageState` (what the steps before it produced; frozen),
writes its files into the staging folder, and returns the next state. The layers below receive plain values
or their own frozen dataclasses (:class:`~modelexport.metadata.build.ExportFacts`,
:class:`~modelexport.optimize.export_pass.VariantSource`), never this context.

The order is the package's: metadata is embedded first and the generation and embedding records join it;
a decoder with a cache gets onnxruntime-genai's genai_config.json from its generation record; the package
files (config.json, processor files, export_metadata.json) are written from it; the sentence
step then gives the copied tokenizer config its ``max_seq_length``; the optimized and quantized copies are
made last, from the graph with its metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .._io import write_json
from ..hierarchy.sidecar import build_sidecar
from ..inference.feeds import SampleSet
from ..metadata.build import ExportFacts
from ..metadata.embed import MetadataStats, embed_metadata
from ..metadata.genai import GENAI_CONFIG_FILE, build_genai_config
from ..metadata.package import GraphSet, Manifest, write_package_files
from ..metadata.schema import KEY_EMBEDDING, KEY_GENERATION
from ..metadata.store import update_metadata
from ..onnxfile import variant_file
from ..optimize.export_pass import (
    GraphVariant,
    VariantSource,
    package_variants,
    write_optimized,
    write_quantized,
)
from .context import ExportContext
from .generation import GenerationGraph, write_generation_files
from .sentence import fit_tokenizer_length

__all__ = ["PACKAGE_STEPS", "PackageState", "PackageStep", "run_package_steps"]


@dataclass(frozen=True)
class PackageState:
    """What the package steps of one graph have produced so far."""

    #: The export settings as the sidecar and the metadata record them (opset, names, dynamic axes, ...).
    settings: dict[str, Any]
    #: The graphs of a multi-graph package (None: one graph).
    graphs: GraphSet | None = None
    #: Files the steps wrote that the manifest lists beside its own (every graph of a set, generation config).
    files: tuple[str, ...] = ()
    #: The metadata embedded in the graph, decoded (None: ``embed_metadata=False``).
    metadata: dict[str, Any] | None = None
    metadata_stats: MetadataStats | None = None
    generation: dict[str, Any] | None = None
    embedding: dict[str, Any] | None = None
    optimized: GraphVariant | None = None
    quantized: GraphVariant | None = None

    @property
    def parity_files(self) -> dict[str, tuple[float, int | None]]:
        """The copies export checks against PyTorch after the write: file name -> (tolerance, example rows
        checked; None: all)."""
        copies = (self.optimized, self.quantized)
        return {
            v.file: (v.parity_atol, v.parity_rows)
            for v in copies
            if v is not None and v.parity_atol is not None
        }


#: step(the graph's export, the state so far) -> the next state.
PackageStep = Callable[[ExportContext, PackageState], PackageState]


def _facts(ctx: ExportContext, state: PackageState) -> ExportFacts:
    cfg = ctx.config
    return ExportFacts(
        ctx.model_proto,
        ctx.loaded,
        state.settings,
        cfg.exporter,
        cfg.static_shapes,
        cfg.task,
        cfg.id2label,
        cfg.processor_config,
        ctx.tokenizer,
    )


def _with_record(ctx: ExportContext, state: PackageState, key: str, record: dict[str, Any]) -> PackageState:
    """``record`` embedded under ``key`` beside the metadata (when metadata is embedded)."""
    if not ctx.config.embed_metadata:
        return state
    update_metadata(ctx.model_proto, {key: record})
    return replace(state, metadata={**(state.metadata or {}), key: record})


def embed_metadata_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """Embed the schema-2.0 metadata (unless ``embed_metadata=False``)."""
    if not ctx.config.embed_metadata:
        ctx.stages.skip("metadata", "--no-embed-metadata")
        return state
    with ctx.stages.stage("metadata", "embed schema 2.0") as st:
        embedded = embed_metadata(_facts(ctx, state))
        ctx.notes.extend(embedded.notes)
        stats = embedded.stats
        st["detail"] = f"{len(embedded.values)} keys, {stats.bytes / 1024:.1f} KB, {stats.extract_ms:.0f} ms"
    return replace(state, metadata=embedded.values, metadata_stats=stats)


def generation_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """generation_config.json beside the model, and the cache layout in the embedded metadata (for inputs
    that describe a generation graph)."""
    if not isinstance(ctx.inputs, GenerationGraph):
        return state
    with ctx.stages.stage("generation", "cache layout, generation_config.json") as st:
        written = write_generation_files(ctx.inputs, ctx.loaded.module, ctx.config.task, ctx.staging_dir)
        record = written.record
        if written.config_file:
            ctx.files["generation_config"] = written.config_file
            state = replace(state, files=(*state.files, written.config_file))  # listed in the manifest
        state = _with_record(ctx, replace(state, generation=record), KEY_GENERATION, record)
        layout = record.get("cache")
        st["detail"] = (
            f"{layout['layers']} layers x {layout['num_key_value_heads']} kv heads x {layout['head_dim']}"
            f" ({layout['dtype']})"
            if layout
            else "no cache in this graph"
        )
    return state


def genai_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """genai_config.json beside a decoder with a key/value cache, naming the graph the folder deploys, so that
    onnxruntime-genai runs the same package; a graph it cannot run gets none, and the log says why."""
    record = state.generation
    if record is None or not record.get("cache"):
        return state
    if state.graphs is not None:
        ctx.stages.skip(
            "genai",
            f"onnxruntime-genai runs one decoder graph; this package has {len(state.graphs.components)}",
        )
        return state
    _, deployed = package_variants(ctx.config.optimize, ctx.config.quantize)
    filename = variant_file(ctx.model_file, deployed) if deployed else ctx.model_file
    module = ctx.loaded.module
    built = build_genai_config(
        ctx.model_proto,
        record,
        filename,
        getattr(module, "config", None),
        getattr(module, "generation_config", None),
    )
    if built.config is None:
        ctx.stages.skip("genai", built.reason)
        ctx.notes.append(
            f"{GENAI_CONFIG_FILE} not written (onnxruntime-genai cannot run this graph): {built.reason}"
        )
        return state
    with ctx.stages.stage("genai", f"onnxruntime-genai config for {filename}"):
        write_json(ctx.staging_dir / GENAI_CONFIG_FILE, built.config)
        ctx.files["genai_config"] = GENAI_CONFIG_FILE
    return replace(state, files=(*state.files, GENAI_CONFIG_FILE))  # listed in the manifest


def package_files_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """config.json, processor files and export_metadata.json beside the model (Optimum's layout)."""
    manifest = None
    if state.metadata is not None and state.metadata_stats is not None:
        manifest = Manifest(state.metadata, state.metadata_stats, state.files, state.graphs)
    with ctx.stages.stage("package", "Optimum-compatible folder") as st:
        cfg = ctx.config
        written = write_package_files(
            ctx.loaded, ctx.tokenizer, cfg.processor_config, ctx.staging_dir, manifest
        )
        ctx.files.update(written.files)
        ctx.notes.extend(written.notes)
        st["detail"] = ", ".join(written.files.values()) or "nothing to add"
    return state


def embedding_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """Record a sentence-transformers folder's embedding (pooling, normalize) in the metadata, before the
    package files are written, so that export_metadata.json carries it as the model does."""
    folder = ctx.loaded.sentence
    if folder is None:
        return state
    with ctx.stages.stage("embedding", "pooling and normalize recorded") as st:
        record = folder.record()
        state = _with_record(ctx, replace(state, embedding=record), KEY_EMBEDDING, record)
        st["detail"] = f"{'+'.join(folder.pooling)} pooling" + (", normalized" if folder.normalize else "")
    return state


def tokenizer_length_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """Give the packaged tokenizer (written by :func:`package_files_step`) the folder's ``max_seq_length``."""
    if ctx.loaded.sentence is not None:
        fit_tokenizer_length(ctx.loaded.sentence, ctx.staging_dir)
    return state


def _variant_source(ctx: ExportContext, state: PackageState) -> VariantSource:
    sidecar = build_sidecar(ctx.model_proto, ctx.tree, ctx.tagging, state.settings, ctx.loaded.info())
    return VariantSource(ctx.model_proto, sidecar, ctx.staging_dir, ctx.model_file)


def optimize_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """``<stem>_<level>.onnx`` (+ sidecar) when ``config.optimize`` names a level: the package's deployed
    model, checked against PyTorch after the write."""
    level = ctx.config.optimize
    if level in (None, "none"):
        return state
    with ctx.stages.stage("optimize", level) as st:
        source = _variant_source(ctx, state)
        variant = write_optimized(source, level, ctx.config.tolerance, deploy=state.graphs is None)
        ctx.files[f"optimized_{level}"] = variant.file
        ctx.files[f"optimized_{level}_hierarchy"] = variant.sidecar_file
        st["detail"] = f"{variant.file}: {len(variant.proto.graph.node)} nodes, tags {variant.coverage_pct}%"
        ctx.notes.extend(variant.notes)
    return replace(state, optimized=variant)


def quantize_step(ctx: ExportContext, state: PackageState) -> PackageState:
    """``<stem>_dynamic.onnx`` / ``<stem>_static.onnx`` (+ sidecar) when ``config.quantize`` asks, from the
    optimized copy when there is one."""
    mode = ctx.config.quantize
    if mode in (None, "none"):
        return state
    samples = None
    if mode == "static":
        samples = SampleSet([ctx.inputs.as_numpy()], None, "example inputs")
        ctx.notes.append(
            "static quantization calibrated on the export's example inputs only; "
            "use `modelexport quantize --mode static --calibration-data` for real calibration"
        )
    with ctx.stages.stage("quantize", mode) as st:
        start = state.optimized.proto if state.optimized is not None else ctx.model_proto
        variant = write_quantized(_variant_source(ctx, state), start, mode, samples)
        ctx.files[f"quantized_{mode}"] = variant.file
        ctx.files[f"quantized_{mode}_hierarchy"] = variant.sidecar_file
        ctx.notes.extend(variant.notes)
        st["detail"] = f"{variant.file}: {len(variant.proto.graph.node)} nodes, tags {variant.coverage_pct}%"
    return replace(state, quantized=variant)


#: The package steps of one graph, run on the tagged graph before it is written, in this order.
PACKAGE_STEPS: tuple[PackageStep, ...] = (
    embed_metadata_step,
    generation_step,
    genai_step,
    embedding_step,
    package_files_step,
    tokenizer_length_step,
    optimize_step,
    quantize_step,
)


def run_package_steps(ctx: ExportContext, state: PackageState) -> PackageState:
    for step in PACKAGE_STEPS:
        state = step(ctx, state)
    return state
