"""``modelexport.export(..., quantize=...)`` writes the quantized model beside model.onnx via the same code."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

import modelexport
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.metadata import read_metadata
from tests.models.torch_models import SmallCNN


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_export_with_quantize_writes_tagged_quantized_model(tmp_path: Path, mode: str) -> None:
    torch.manual_seed(0)
    result = modelexport.export(SmallCNN().eval(), tmp_path / "pkg", input_shape=(1, 1, 8, 8), quantize=mode)
    q_path = tmp_path / "pkg" / f"model_{mode}.onnx"
    assert result.files[f"quantized_{mode}"] == q_path.name and q_path.is_file()
    q = onnx.load(q_path)
    assert all({p.key: p.value for p in n.metadata_props}.get(TAG_KEY) for n in q.graph.node)
    assert read_metadata(q_path)["modelexport.quantization"]["mode"] == mode
    side = json.loads((tmp_path / "pkg" / f"model_{mode}_hierarchy.json").read_text())
    assert side["coverage"]["coverage_pct"] == 100.0 and len(side["nodes"]) == len(q.graph.node)
    assert any("example inputs" in n for n in result.notes) == (mode == "static")


@pytest.mark.integration
def test_export_cli_quantize_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from modelexport.cli.app import main

    factory = tmp_path / "net.py"
    factory.write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()\n"
    )
    code = main(
        ["export", f"{factory}:make", str(tmp_path / "pkg"), "--input-shape", "2,6", "--quantize", "dynamic"]
    )
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "pkg" / "model_dynamic.onnx").is_file() and (tmp_path / "pkg" / "model.onnx").is_file()
