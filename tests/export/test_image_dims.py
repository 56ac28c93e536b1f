"""Image inputs name their dynamic axes by meaning, as Optimum does (``batch_size``, ``height``, ``width``), and
only where the graph really takes another size: a CNN does, a vision transformer's position embeddings do not."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.metadata.store import read_metadata
from modelexport.runtime.session import create_session
from tests.models.hf_models import tiny_hf_model


def _dims(path: str) -> list[Any]:
    model = onnx.load(path, load_external_data=False)
    return [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def _recorded_axes(path: str) -> Any:
    config = read_metadata(path)["modelexport.export_config"]
    return config["dynamic_axes"]["pixel_values"]


@pytest.mark.sanity
def test_a_cnn_takes_any_image_size_with_named_axes(export_cache: Any) -> None:
    import torch

    model = tiny_hf_model("resnet")
    result = export_cache.get("tiny_resnet", lambda: model)
    assert _dims(result.onnx_path) == ["batch_size", 3, "height", "width"]
    assert {int(k): v for k, v in _recorded_axes(result.onnx_path).items()} == {
        0: "batch_size",
        2: "height",
        3: "width",
    }
    x = torch.randn(2, 3, 48, 40)  # not the export's size
    with torch.no_grad():
        ref = model(pixel_values=x)
    ref = (ref.last_hidden_state if hasattr(ref, "last_hidden_state") else ref[0]).numpy()
    out = create_session(result.onnx_path)[0].run(None, {"pixel_values": x.numpy()})[0]
    assert out.shape == ref.shape and np.abs(out - ref).max() <= 1e-4


@pytest.mark.sanity
def test_a_vision_transformer_keeps_its_fixed_size(export_cache: Any) -> None:
    result = export_cache.get("tiny_vit", lambda: tiny_hf_model("vit"))
    assert _dims(result.onnx_path) == ["batch_size", 3, 32, 32]
    assert {int(k): v for k, v in _recorded_axes(result.onnx_path).items()} == {0: "batch_size"}
