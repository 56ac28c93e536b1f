"""The extraction proof over architectures and exporters (tiny models, random weights)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.inspect.conftest import prove, spec_inputs

#: (tiny HF model, exporter, module paths to cut out; "a|b": the first the model has, as transformers renamed
#: modules between versions: 5.2x's ViT holds its blocks in ``layers``, 4.x's in ``encoder.layer``)
GRID = [
    ("gpt2", "dynamo", ["h.0", "h.1"]),
    ("vit", "dynamo", ["encoder.layer.0|layers.0"]),
    ("resnet", "dynamo", ["encoder.stages.0", "encoder.stages.1"]),
    ("llama", "dynamo", ["layers.0"]),
    ("bert", "torchscript", ["encoder.layer.0", "encoder.layer.1"]),
]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(("name", "exporter", "paths"), GRID, ids=[f"{g[0]}-{g[1]}" for g in GRID])
def test_blocks_match_torch(export_cache: Any, name: str, exporter: str, paths: list[str]) -> None:
    from tests.models.hf_models import tiny_hf_model

    model = tiny_hf_model(name)
    export = export_cache.get(f"grid_{name}", model, exporter=exporter)
    example = spec_inputs(export)
    names = dict(model.named_modules())
    for choices in paths:
        path = next(p for p in choices.split("|") if p in names)
        sub, worst = prove(model, model.get_submodule(path), example, export.onnx_path, path)
        assert sub.module_path == path and worst <= 1e-4


@pytest.mark.must
@pytest.mark.parametrize("call", [0, 1])
def test_module_called_twice_torchscript(export_cache: Any, call: int) -> None:
    from tests.models.torch_models import ReuseTwice

    torch.manual_seed(0)
    module = ReuseTwice().eval()
    export = export_cache.get("reuse_twice_ts", module, exporter="torchscript")
    sub, worst = prove(module, module.block, {"x": torch.randn(3, 8)}, export.onnx_path, "block", call=call)
    assert (sub.call_index, sub.call_count) == (call, 2) and worst <= 1e-4
