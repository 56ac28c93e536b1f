"""The optimized and quantized copies ``modelexport export`` writes into its package.

Export's steps call these with a :class:`VariantSource` (the tagged graph, its sidecar, the staging folder)
and record the :class:`GraphVariant` each returns; nothing here reads export's own state.

``--optimize O1..O4`` writes ``model_<level>.onnx`` with the same :func:`optimize_with_record` as
``modelexport optimize -O*`` and records it as the package's deployed model (what ``infer``,
``pipeline()`` and ``evaluate`` load from the folder); export checks it against PyTorch like
``model.onnx`` (:attr:`GraphVariant.parity_atol`).

``--quantize dynamic|static`` writes ``model_<mode>.onnx`` with the same :func:`quantize_proto` as
``modelexport quantize``, from the optimized graph when there is one. Static mode calibrates on the
export's example inputs (one sample: ranges fit those inputs only) and says so in the notes; for
real calibration run ``modelexport quantize --mode static --calibration-data`` on the package.

A graph of a multi-graph package (encoder-decoder: ``encoder_model.onnx``, ...) gets the same passes, its
outputs named after it (``encoder_model_O2.onnx``, ``decoder_model_dynamic.onnx``): :func:`package_variants`
says which sets the passes write, so the manifest can list them (and the deployed one) up front.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import write_json
from ..hierarchy.passes import PassStep
from ..inference.feeds import SampleSet
from ..metadata.genai import GENAI_CONFIG_FILE, retarget_genai_config
from ..onnxfile import record_deployed_model, save_onnx, sidecar_path_for, variant_file
from .carry import remap_sidecar
from .config import OptimizeConfig, QuantizeConfig
from .graph import op_changes, optimize_with_record
from .group_query import shares_cache_buffer
from .quantization import quantize_proto
from .retag import tag_coverage

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GraphVariant",
    "VariantSource",
    "package_variants",
    "parity_atol",
    "write_optimized",
    "write_quantized",
]

#: Extra parity tolerance of numerics-changing options (tanh Gelu, float16), added to the export's atol.
APPROXIMATION_ATOL = {"approximate_gelu": 1e-3, "fp16": 2e-2}


@dataclass(frozen=True)
class VariantSource:
    """What a copy is made from: the tagged graph, its sidecar, and where the copies go
    (``<folder>/<stem>_<suffix>.onnx``, named after ``model_file``)."""

    proto: onnx.ModelProto
    sidecar: dict[str, Any]
    folder: Path
    model_file: str


@dataclass(frozen=True)
class GraphVariant:
    """A copy written beside the graph (``model_O2.onnx`` + its sidecar) and what the export records of it."""

    proto: onnx.ModelProto
    file: str
    sidecar_file: str
    coverage_pct: float
    #: What was done: the optimization's file, preset, fusions and op changes; the quantization's record.
    record: dict[str, Any]
    notes: tuple[str, ...] = ()
    #: The tolerance export checks the copy against PyTorch with (None: not checked).
    parity_atol: float | None = None
    #: The example's rows it is checked on (None: all). A cache given to ``GroupQueryAttention`` takes several
    #: new tokens onto a non-empty past for one row only (ONNX Runtime's rule), as the export's example step
    #: is; rows are independent, so the first row checks the same numbers.
    parity_rows: int | None = None


def package_variants(optimize: str | None, quantize: str | None) -> tuple[list[str], str | None]:
    """The suffixes of the copies the passes write of each graph (``["O2", "dynamic"]``) and the deployed one
    (the optimized copy; int8 is written, not deployed, as for one graph)."""
    level = None if optimize in (None, "none") else optimize
    mode = None if quantize in (None, "none") else quantize
    return [s for s in (level, mode) if s], level


def parity_atol(cfg: OptimizeConfig, atol: float) -> float:
    """The tolerance an optimized graph is held to: the export's, widened by the approximations it asks for."""
    return atol + sum(extra for option, extra in APPROXIMATION_ATOL.items() if getattr(cfg, option))


def fusion_summary(steps: list[PassStep]) -> str:
    """'attention 2, skip_layer_normalization 4, ...' from the transformer-fusion record: onnxscript's
    matches, then what ORT's transformer optimizer left in the graph when it ran ('' without fusion)."""
    for step in steps:
        stats = step.record.get("stats", {})
        if "engine" not in stats:
            continue
        parts = [", ".join(f"{name} {count}" for name, count in stats.get("matched", {}).items())]
        if "ort" in stats:
            parts.append("ORT optimizer: " + ", ".join(f"{k} {v}" for k, v in stats["ort"]["fused"].items()))
        return "; ".join(p for p in parts if p) or "nothing matched"
    return ""


def _write(
    source: VariantSource, model: onnx.ModelProto, suffix: str, transform: dict[str, Any]
) -> tuple[str, str]:
    """Save ``model`` as the ``suffix`` copy with its sidecar; their file names."""
    name = variant_file(source.model_file, suffix)
    save_onnx(model, source.folder / name)
    side = sidecar_path_for(source.folder / name)
    write_json(side, remap_sidecar(source.sidecar, model, transform))
    return name, side.name


def write_optimized(source: VariantSource, level: str, tolerance: float, *, deploy: bool) -> GraphVariant:
    """Write ``<stem>_<level>.onnx`` (+ sidecar); ``deploy`` records it as the package's deployed model (one
    graph; a package's graph set is recorded with its manifest). It is held to ``tolerance``, widened by the
    approximations the level asks for."""
    cfg = OptimizeConfig.preset(level)
    optimized, steps, _ = optimize_with_record(source.proto, cfg)
    name, side = _write(source, optimized, level, {"kind": "optimize", **cfg.record()})
    kept, shared = None, shares_cache_buffer(optimized)
    if deploy:
        record_deployed_model(source.folder, name)
        # genai_config.json was written for the deployed graph, whose cache -O2 may have made shareable
        genai = source.folder / GENAI_CONFIG_FILE
        if genai.is_file() and shared:
            kept = retarget_genai_config(genai, optimized, name, shared_buffer=True)
    changes = op_changes(source.proto, optimized)
    fused = fusion_summary(steps)
    coverage = tag_coverage(optimized)["coverage_pct"]
    note = (
        f"-{level}: {name} is deployed ({len(source.proto.graph.node)} -> "
        f"{len(optimized.graph.node)} nodes, tags {coverage}%)" + (f"; fused: {fused}" if fused else "")
    )
    record = {"file": name, "preset": level, "fused": fused, "op_changes": changes}
    notes = (note, f"{GENAI_CONFIG_FILE} keeps onnxruntime-genai's cache copies: {kept}") if kept else (note,)
    rows = 1 if shared else None
    return GraphVariant(optimized, name, side, coverage, record, notes, parity_atol(cfg, tolerance), rows)


def write_quantized(
    source: VariantSource, start: onnx.ModelProto, mode: str, samples: SampleSet | None
) -> GraphVariant:
    """Write ``<stem>_<mode>.onnx`` (+ sidecar): ``start`` (the optimized graph, else the tagged one) quantized,
    static mode calibrated on ``samples``."""
    quantized, facts = quantize_proto(start, QuantizeConfig(mode=mode, progress=False), samples)
    name, side = _write(source, quantized, mode, {"kind": "quantize", **facts["record"]})
    coverage = facts["retag"]["coverage_pct"]
    return GraphVariant(quantized, name, side, coverage, facts["record"], tuple(facts["notes"]))
