"""``modelexport export --quantize dynamic|static``: the package pass that writes ``model_<mode>.onnx``.

It calls the same :func:`quantize_proto` as ``modelexport quantize``. Static mode calibrates on the
export's example inputs (one sample: ranges fit those inputs only) and says so in the notes; for
real calibration run ``modelexport quantize --mode static --calibration-data`` on the package.
"""

from __future__ import annotations

from typing import Any

from .._io import write_json
from ..hierarchy.sidecar import build_sidecar
from ..inference.feeds import SampleSet
from ..onnxfile import save_onnx, sidecar_path_for
from .carry import remap_sidecar
from .config import QuantizeConfig
from .quantization import quantize_proto

__all__ = ["quantize_package_pass"]


def _sidecar(ctx: Any) -> dict[str, Any]:
    settings = ctx.extra.get("export_settings", {})
    return build_sidecar(ctx.model_proto, ctx.tree, ctx.tagging, settings, ctx.loaded.info())


def quantize_package_pass(ctx: Any) -> None:
    """Write ``model_dynamic.onnx`` / ``model_static.onnx`` (+ its sidecar) when ``config.quantize`` asks."""
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
        quantized, facts = quantize_proto(ctx.model_proto, QuantizeConfig(mode=mode, progress=False), samples)
        name = f"model_{mode}.onnx"
        save_onnx(quantized, ctx.staging_dir / name)
        side = sidecar_path_for(ctx.staging_dir / name)
        write_json(side, remap_sidecar(_sidecar(ctx), quantized, {"kind": "quantize", **facts["record"]}))
        ctx.files[f"quantized_{mode}"] = name
        ctx.files[f"quantized_{mode}_hierarchy"] = side.name
        ctx.notes.extend(facts["notes"])
        st["detail"] = f"{name}: {len(quantized.graph.node)} nodes, tags {facts['retag']['coverage_pct']}%"
