"""The model families that used to fail, each from a tiny config saved as a folder (what a user has):
autograd-only ops under capture (relative position bias, weight-norm conv), multimodal inputs from
each sub-config, spectrogram inputs, mixture-of-experts routing, and the hint after a failed forward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import modelexport
from modelexport.errors import InputSpecError
from modelexport.export.experts import EXPERT_ROUTE
from modelexport.export.topology import compare_topology
from modelexport.runtime.session import create_session
from tests.export.test_grid import assert_export_invariants
from tests.models.hf_grid import save_tiny


def _export(name: str, tmp_path: Path, **options: Any) -> Any:
    folder = save_tiny(name, tmp_path / "model")
    return modelexport.export(folder, tmp_path / "out", verify_topology=True, **options)


def _plain_export_under_no_grad(folder: Path, result: Any) -> Any:
    """What a user gets from torch.onnx.export itself under torch.no_grad(), with our recorded settings."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder).eval()
    settings = json.loads(result.hierarchy_path.read_text())["export"]
    kwargs = {
        s["name"]: torch.randn(s["shape"])
        if s["dtype"].startswith("float")
        else torch.ones(s["shape"], dtype=torch.int64)
        for s in settings["input_specs"]
    }
    # the recorded axis names (Optimum's), so that only the graphs are compared, not dim labels like "s99"
    dims = {
        name: torch.export.Dim(name) for axes in settings["dynamic_axes"].values() for name in axes.values()
    }
    dynamic = {
        n: {int(a): dims[name] for a, name in axes.items()} for n, axes in settings["dynamic_axes"].items()
    }
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            (),
            kwargs=kwargs,
            dynamo=True,
            input_names=settings["input_names"],
            output_names=settings["output_names"],
            dynamic_shapes=dynamic,
            report=False,
            verbose=False,
        )
    return program.model_proto


@pytest.mark.must
@pytest.mark.slow
def test_relative_position_bias_exports_under_no_grad_like_a_plain_export(tmp_path: Path) -> None:
    result = _export("beit", tmp_path)
    assert_export_invariants(result)
    plain = _plain_export_under_no_grad(tmp_path / "model", result)
    diff = compare_topology(onnx.load(str(result.onnx_path)), plain)
    assert diff.identical, diff.differences


@pytest.mark.must
@pytest.mark.slow
def test_weight_norm_conv_audio_encoder(tmp_path: Path) -> None:
    assert_export_invariants(_export("wavlm", tmp_path))


@pytest.mark.must
@pytest.mark.slow
@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_multimodal_models_get_every_modality_input(name: str, tmp_path: Path) -> None:
    result = _export(name, tmp_path)
    assert_export_invariants(result)
    inputs = {i.name: i for i in onnx.load(str(result.onnx_path)).graph.input}
    assert {"input_ids", "pixel_values"} <= set(inputs)
    dims = [d.dim_value for d in inputs["pixel_values"].type.tensor_type.shape.dim]
    assert dims[1:] == [3, 32, 32]  # channels and size from vision_config, not the top-level config
    assert {"logits_per_image", "text_embeds", "image_embeds"} <= set(result.parity["max_abs_diff"])


@pytest.mark.must
@pytest.mark.integration
def test_spectrogram_input_shape_comes_from_the_config(tmp_path: Path) -> None:
    result = _export("audio-spectrogram-transformer", tmp_path)
    assert_export_invariants(result)
    (spec,) = json.loads(result.hierarchy_path.read_text())["export"]["input_specs"]
    assert spec["name"] == "input_values" and spec["shape"][1:] == [32, 16]  # max_length, num_mel_bins


@pytest.mark.must
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_mixture_of_experts_every_expert_is_captured(name: str, tmp_path: Path) -> None:
    """Parity on the example, and on inputs so short that the router hits only some experts: the graph
    must not depend on which experts the example happened to hit."""
    import transformers

    result = _export(name, tmp_path)
    assert_export_invariants(result)
    assert EXPERT_ROUTE in result.notes
    model = transformers.AutoModel.from_pretrained(tmp_path / "model").eval()
    if hasattr(model, "set_experts_implementation"):  # 5.x: grouped_mm needs 16-byte strides on the CPU
        model.set_experts_implementation("eager")
    session, _ = create_session(str(result.onnx_path))
    for shape in [(1, 1), (1, 2), (3, 5)]:
        ids = torch.randint(0, 99, shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(input_ids=ids, use_cache=False).last_hidden_state.numpy()
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones(shape, np.int64)}
        wanted = {i.name for i in session.get_inputs()}
        (got,) = session.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in wanted})
        assert np.abs(got - want).max() < 1e-4, shape


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, image: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.fc(image) * scale


@pytest.mark.sanity
def test_failed_forward_hint_names_the_real_forward_parameters(tmp_path: Path) -> None:
    with pytest.raises(InputSpecError) as info:
        modelexport.export(_TwoInputs(), tmp_path / "a")
    assert '"name": "image"' in info.value.hint and '"name": "scale"' in info.value.hint
    assert '"name": "x"' not in info.value.hint
    seq = nn.Sequential(nn.Linear(6, 3))
    with pytest.raises(InputSpecError, match="failed on the example inputs") as info:
        modelexport.export(seq, tmp_path / "b", input_specs=[{"name": "input", "shape": [2, 5]}])
    assert '{"name": "input", "shape": [2, 5], "dtype": "float32"}' in info.value.hint
    assert "Sequential.forward(input)" in info.value.hint
