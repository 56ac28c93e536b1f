"""``export --optimize O1..O4`` deploys the optimized graph; int8 after -O2 fusion keeps accuracy and tags."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.errors import ConfigError
from modelexport.export import ExportConfig
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.metadata import read_metadata
from modelexport.onnxfile import resolve_model_path
from modelexport.optimize.config import OptimizeConfig
from modelexport.optimize.graph import optimize_model
from modelexport.optimize.quantization import quantize
from tests.optimize.test_calibration import MIN_AGREEMENT, MIN_LOGIT_COSINE


def _all_tagged(model: onnx.ModelProto) -> bool:
    return all({p.key: p.value for p in n.metadata_props}.get(TAG_KEY) for n in model.graph.node)


@pytest.mark.sanity
def test_export_optimize_takes_the_optimize_presets() -> None:
    assert ExportConfig(optimize="o2").optimize == "O2"
    with pytest.raises(ConfigError, match="O1, O2, O3, O4"):
        ExportConfig(optimize="O5")


@pytest.mark.integration
def test_export_cli_optimize_o2_deploys_the_fused_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny BERT config through the CLI with ``--optimize O2 --quantize dynamic``: the fused graph is the
    deployed model, tagged everywhere, equal to PyTorch within the export tolerance; int8 starts from it."""
    from modelexport.cli.app import main
    from tests.models.hf_models import tiny_hf_model

    src = tmp_path / "tiny_bert"
    tiny_hf_model("bert").save_pretrained(src)
    pkg = tmp_path / "pkg"
    code = main(["export", str(src), str(pkg), "--optimize", "O2", "--quantize", "dynamic"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "fused: attention 2" in out and "skip_layer_normalization 4" in out
    assert "parity of model_O2.onnx vs PyTorch (atol 0.0001)" in out

    deployed = resolve_model_path(pkg)
    assert deployed == pkg / "model_O2.onnx"
    fused = onnx.load(deployed)
    ops = Counter(n.op_type for n in fused.graph.node)
    assert (ops["Attention"], ops["SkipLayerNormalization"], ops["Softmax"]) == (2, 0, 0)
    assert _all_tagged(fused)
    meta, plain = read_metadata(deployed), read_metadata(pkg / "model.onnx")
    assert set(plain) <= set(meta) and meta["modelexport.optimization"]["preset_name"] == "O2"
    side = json.loads((pkg / "model_O2_hierarchy.json").read_text())
    assert side["coverage"]["coverage_pct"] == 100.0 and len(side["nodes"]) == len(fused.graph.node)
    assert side["transforms"][-1]["kind"] == "optimize"

    int8 = onnx.load(pkg / "model_dynamic.onnx")
    assert _all_tagged(int8) and "Softmax" not in {n.op_type for n in int8.graph.node}


@pytest.mark.integration
def test_dynamic_int8_after_o2_fusion_keeps_accuracy_and_tags(
    seq_cls_export: Any, sst2_words: Path, tmp_path: Path
) -> None:
    """The probe of the text quantization test (SST-2 sentences through the model's tokenizer: logit cosine,
    argmax agreement, accuracy), on the -O2 graph of the tiny classifier quantized dynamically."""
    fused = tmp_path / "o2.onnx"
    optimize_model(Path(seq_cls_export.onnx_path), fused, OptimizeConfig.preset("O2"))
    assert "Attention" in {n.op_type for n in onnx.load(fused).graph.node}
    result = quantize(fused, tmp_path / "o2_int8.onnx", mode="dynamic", eval_data=sst2_words, progress=False)
    e = result.evaluation
    assert e["samples"] == 48
    assert e["mean_cosine"] > MIN_LOGIT_COSINE and e["agreement"] >= MIN_AGREEMENT
    assert abs(e["accuracy_fp32"] - e["accuracy_quantized"]) <= 1 - MIN_AGREEMENT
    assert result.coverage["coverage_pct"] == 100.0
    quantized = onnx.load(tmp_path / "o2_int8.onnx")
    assert _all_tagged(quantized) and {"DynamicQuantizeLinear", "MatMulInteger"} & {
        n.op_type for n in quantized.graph.node
    }
