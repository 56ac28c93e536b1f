"""The package passes of ``modelexport export`` that live in this layer.

``--optimize O1..O4`` writes ``model_<level>.onnx`` with the same :func:`optimize_with_record` as
``modelexport optimize -O*`` and records it as the package's deployed model (what ``infer``,
``pipeline()`` and ``evaluate`` load from the folder); export checks it against PyTorch like
``model.onnx`` (:data:`PARITY_FILES_KEY`).

``--quantize dynamic|static`` writes ``model_<mode>.onnx`` with the same :func:`quantize_proto` as
``modelexport quantize``, from the optimized graph when there is one. Static mode calibrates on the
export's example inputs (one sample: ranges fit those inputs only) and says so in the notes; for
real calibration run ``modelexport quantize --mode static --calibration-data`` on the package.

A graph of a multi-graph package (encoder-decoder: ``encoder_model.onnx``, ...) gets the same passes, its
outputs named after it (``encoder_model_O2.onnx``, ``decoder_model_dynamic.onnx``): :func:`package_variants`
says which sets the passes write, so the manifest can list them (and the deployed one) up front.
"""

from __future__ import annotations

from typing import Any

from .._io import write_json
from ..hierarchy.sidecar import build_sidecar
from ..inference.feeds import SampleSet
from ..onnxfile import COMPONENTS_KEY, record_deployed_model, save_onnx, sidecar_path_for, variant_file
from .carry import remap_sidecar
from .config import OptimizeConfig, QuantizeConfig
from .graph import op_changes, optimize_with_record
from .quantization import quantize_proto
from .retag import tag_coverage

__all__ = [
    "OPTIMIZED_KEY",
    "PARITY_FILES_KEY",
    "optimize_package_pass",
    "package_variants",
    "quantize_package_pass",
]

#: ``ctx.extra`` key: the optimized ModelProto (quantization starts from it).
OPTIMIZED_KEY = "optimized_proto"
#: ``ctx.extra`` key: {file name in the package: parity tolerance}; export checks each against PyTorch.
PARITY_FILES_KEY = "parity_files"
#: Extra parity tolerance of numerics-changing options (tanh Gelu, float16), added to the export's atol.
APPROXIMATION_ATOL = {"approximate_gelu": 1e-3, "fp16": 2e-2}


def package_variants(optimize: str | None, quantize: str | None) -> tuple[list[str], str | None]:
    """The suffixes of the copies the passes write of each graph (``["O2", "dynamic"]``) and the deployed one
    (the optimized copy; int8 is written, not deployed, as for one graph)."""
    level = None if optimize in (None, "none") else optimize
    mode = None if quantize in (None, "none") else quantize
    return [s for s in (level, mode) if s], level


def _sidecar(ctx: Any) -> dict[str, Any]:
    settings = ctx.extra.get("export_settings", {})
    return build_sidecar(ctx.model_proto, ctx.tree, ctx.tagging, settings, ctx.loaded.info())


def parity_atol(cfg: OptimizeConfig, atol: float) -> float:
    """The tolerance an optimized graph is held to: the export's, widened by the approximations it asks for."""
    return atol + sum(extra for option, extra in APPROXIMATION_ATOL.items() if getattr(cfg, option))


def fusion_summary(steps: list[Any]) -> str:
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


def optimize_package_pass(ctx: Any) -> None:
    """Write ``<stem>_<level>.onnx`` (+ sidecar) when ``config.optimize`` names a level; it becomes the
    deployed model of the package and is checked against PyTorch after the write."""
    level = ctx.config.optimize
    if level in (None, "none"):
        return
    cfg = OptimizeConfig.preset(level)
    with ctx.stages.stage("optimize", level) as st:
        optimized, steps, _ = optimize_with_record(ctx.model_proto, cfg)
        name = variant_file(ctx.model_file, level)
        save_onnx(optimized, ctx.staging_dir / name)
        side = sidecar_path_for(ctx.staging_dir / name)
        write_json(side, remap_sidecar(_sidecar(ctx), optimized, {"kind": "optimize", **cfg.record()}))
        if COMPONENTS_KEY not in ctx.extra:  # a package's graph set is recorded with the package's manifest
            record_deployed_model(ctx.staging_dir, name)
        ctx.files[f"optimized_{level}"] = name
        ctx.files[f"optimized_{level}_hierarchy"] = side.name
        ctx.extra[OPTIMIZED_KEY] = optimized
        ctx.extra.setdefault(PARITY_FILES_KEY, {})[name] = parity_atol(cfg, ctx.config.tolerance)
        changes = op_changes(ctx.model_proto, optimized)
        fused = fusion_summary(steps)
        coverage = tag_coverage(optimized)["coverage_pct"]
        st["detail"] = f"{name}: {len(optimized.graph.node)} nodes, tags {coverage}%"
        ctx.extra["optimization"] = {"file": name, "preset": level, "fused": fused, "op_changes": changes}
        ctx.notes.append(
            f"-{level}: {name} is deployed ({len(ctx.model_proto.graph.node)} -> "
            f"{len(optimized.graph.node)} nodes, tags {coverage}%)" + (f"; fused: {fused}" if fused else "")
        )


def quantize_package_pass(ctx: Any) -> None:
    """Write ``<stem>_dynamic.onnx`` / ``<stem>_static.onnx`` (+ its sidecar) when ``config.quantize`` asks."""
    mode = ctx.config.quantize
    if mode in (None, "none"):
        return
    samples = None
    if mode == "static":
        samples = SampleSet([ctx.inputs.as_numpy()], None, "example inputs")
        ctx.notes.append(
            "static quantization calibrated on the export's example inputs only; "
            "use `modelexport quantize --mode static --calibration-data` for real calibration"
        )
    with ctx.stages.stage("quantize", mode) as st:
        source = ctx.extra.get(OPTIMIZED_KEY, ctx.model_proto)
        quantized, facts = quantize_proto(source, QuantizeConfig(mode=mode, progress=False), samples)
        name = variant_file(ctx.model_file, mode)
        save_onnx(quantized, ctx.staging_dir / name)
        side = sidecar_path_for(ctx.staging_dir / name)
        write_json(side, remap_sidecar(_sidecar(ctx), quantized, {"kind": "quantize", **facts["record"]}))
        ctx.files[f"quantized_{mode}"] = name
        ctx.files[f"quantized_{mode}_hierarchy"] = side.name
        ctx.notes.extend(facts["notes"])
        st["detail"] = f"{name}: {len(quantized.graph.node)} nodes, tags {facts['retag']['coverage_pct']}%"
