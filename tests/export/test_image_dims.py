"""Image inputs: ``[batch_size, 3, height, width]`` as Optimum names them where the model takes another size,
the example's height/width where it does not, decided by behaviour (src/modelexport/export/free_axes.py).

The CNN and the vision transformer are the default grid's own exports (tests/export/test_grid.py, shared
through ``export_cache``), so these checks add no export of their own but the tiny size-baked model's.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import onnx
import pytest

import modelexport
from modelexport.errors import FixedAxisError
from modelexport.export import free_axes
from modelexport.export.capture import CaptureSettings, capture
from modelexport.export.config import ExportConfig, InputSpec
from modelexport.export.inputs import build_inputs
from modelexport.metadata.store import read_metadata
from modelexport.runtime.session import create_session
from tests.models.hf_models import tiny_hf_model
from tests.models.torch_models import SizeBakedNet

ATOL = 1e-4
#: A symbol torch made up (``s41``), left in a shape: every dynamic axis must carry our name.
TORCH_SYMBOL = re.compile(r"(?<![a-z_])s\d+")


def _grid_export(export_cache: Any, name: str, exporter: str = "dynamo") -> Any:
    """The export tests/export/test_grid.py makes (same cache key and options)."""
    return export_cache.get(
        f"hf-{name}", lambda: tiny_hf_model(name), exporter=exporter, verify_topology=True
    )


def _dims(value: onnx.ValueInfoProto) -> list[Any]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _stage(result: Any, name: str) -> list[str]:
    return [s["detail"] for s in result.stages if s["stage"] == name]


def _recorded_axes(path: Any) -> dict[int, str]:
    axes = read_metadata(path)["modelexport.export_config"]["dynamic_axes"]["pixel_values"]
    return {int(k): v for k, v in axes.items()}


@pytest.mark.must
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_cnn_takes_other_image_sizes_named_as_optimum_names_them(export_cache: Any, exporter: str) -> None:
    import torch

    result = _grid_export(export_cache, "resnet", exporter)
    model = onnx.load(str(result.onnx_path))
    assert _dims(model.graph.input[0]) == ["batch_size", 3, "height", "width"]
    shapes = [_dims(v) for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)]
    assert not [d for dims in shapes for d in dims if isinstance(d, str) and TORCH_SYMBOL.search(d)]
    # the metadata describes the graph's own axes
    assert _recorded_axes(result.onnx_path) == {0: "batch_size", 2: "height", 3: "width"}
    recorded = read_metadata(result.onnx_path)["modelexport.inputs"]
    assert recorded[0]["shape"] == ["batch_size", 3, "height", "width"]
    assert result.topology_identical is True and not result.notes
    assert "dynamic" in _stage(result, "size_check")[0]
    # another batch and size than the export's 2 x 64 x 64, against PyTorch there
    x = torch.randn(3, 3, 48, 40)
    with torch.no_grad():
        ref = tiny_hf_model("resnet")(pixel_values=x)
    session = create_session(result.onnx_path)[0]
    outputs = session.run(None, {"pixel_values": x.numpy()})
    for got, want in zip(outputs, (ref.last_hidden_state, ref.pooler_output), strict=True):
        assert got.shape == tuple(want.shape) and np.abs(got - want.numpy()).max() <= ATOL


@pytest.mark.must
def test_a_vision_transformer_keeps_its_fixed_size_without_a_second_capture(export_cache: Any) -> None:
    """Its position embeddings fail eagerly at another size: captured once, fixed, as before (so -O2 still
    fuses its attention: tests/optimize/test_fusion.py::test_o2_fuses_vit)."""
    result = _grid_export(export_cache, "vit")
    model = onnx.load(str(result.onnx_path))
    assert _dims(model.graph.input[0]) == ["batch_size", 3, 32, 32]
    assert _recorded_axes(result.onnx_path) == {0: "batch_size"}
    assert "fixed: PyTorch fails at 40x48" in _stage(result, "size_probe")[0]
    assert len(_stage(result, "capture")) == 1 and not _stage(result, "size_check") and not result.notes


@pytest.mark.must
@pytest.mark.parametrize(
    ("exporter", "why"),
    [("dynamo", "torch.export's graph fails at 40x48"), ("torchscript", "the ONNX graph fails at 40x48")],
)
def test_a_size_the_graph_bakes_in_is_captured_fixed_and_noted(
    tmp_path: Any, exporter: str, why: str
) -> None:
    """PyTorch runs at 40x48, but torch.export guards on the size (caught on its graph, before the ONNX
    translation) and TorchScript bakes it in (caught on the ONNX graph): captured again, fixed. (The default
    grid's BEiT takes this path with its topology verified: tests/export/test_model_grid.py.)"""
    import torch

    torch.manual_seed(0)
    result = modelexport.export(SizeBakedNet(), tmp_path / "out", exporter=exporter)
    model = onnx.load(str(result.onnx_path))
    assert _dims(model.graph.input[0]) == ["batch_size", 3, 32, 32]
    assert _recorded_axes(result.onnx_path) == {0: "batch_size"}
    assert any(n.startswith("image height/width fixed") and why in n for n in result.notes), result.notes
    assert _stage(result, "capture")[-1] == f"{exporter}, height/width fixed" and result.parity["passed"]


@pytest.mark.sanity
def test_torch_export_past_its_time_budget_is_given_up() -> None:
    """Some size arithmetic keeps sympy busy for minutes (window attention padding to window multiples):
    torch.export gets a CPU-time budget from the eager run's size, and past it the axes are fixed."""
    import torch

    torch.manual_seed(0)
    model = SizeBakedNet().eval()
    inputs = build_inputs(model, ExportConfig())
    with torch.no_grad():
        reference = [("output", model(**inputs.forward_kwargs()))]
    other, _ = free_axes.probe_other_size(model, inputs, reference, ATOL, scaled=False)
    assert other is not None and other.export_budget_s == free_axes.EXPORT_BUDGET_S + 5 * 0.05  # 5 calls
    settings = CaptureSettings("dynamo", None, None, False, False, False)
    with pytest.raises(FixedAxisError, match="torch.export took over 0.001 CPU s with height/width free"):
        capture(model, inputs.trying(replace(other, export_budget_s=1e-3)), settings)


@pytest.mark.sanity
def test_static_shapes_and_user_specs_keep_image_sizes_as_given() -> None:
    """Only generated image inputs are tried free; user specs say exactly which axes are dynamic."""
    model = SizeBakedNet()
    generated = build_inputs(model, ExportConfig())
    assert generated.free_axes == {"pixel_values": {2: "height", 3: "width"}}
    assert generated.dynamic_axes(False) == {"pixel_values": {0: "batch_size"}}  # until decided
    assert generated.fixed().free_axes == {} and generated.fixed().specs == generated.specs
    spec = InputSpec("pixel_values", (2, 3, 32, 32), "float32", {0: "batch_size"})
    assert build_inputs(model, ExportConfig(input_specs=(spec,))).free_axes == {}


@pytest.mark.sanity
def test_the_probe_step_keeps_patch_and_stride() -> None:
    """One patch (config) or output stride (a 64 px input giving 8 px maps: 8) taller, two wider."""
    import torch

    resnet = tiny_hf_model("resnet")
    inputs = build_inputs(resnet, ExportConfig())
    with torch.no_grad():
        out = resnet(**inputs.forward_kwargs())
    reference = [("last_hidden_state", out.last_hidden_state), ("pooler_output", out.pooler_output)]
    assert free_axes.size_step(resnet, inputs, reference) == 8  # the 1x1 pooled output shows nothing
    other, detail = free_axes.probe_other_size(resnet, inputs, reference, ATOL, scaled=False)
    assert other is not None and other.label == "72x80" and "tried dynamic" in detail
    vit = tiny_hf_model("vit")
    assert free_axes.size_step(vit, build_inputs(vit, ExportConfig()), []) == 8  # its patch size
