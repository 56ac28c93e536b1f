"""Graph optimization passes on a real tiny BERT export: tags 100%, outputs equal, metadata kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.errors import ConfigError, OnnxFileError
from modelexport.hierarchy.tags import TAG_KEY, common_ancestor
from modelexport.metadata import read_metadata
from modelexport.optimize.graph import GRAPH_PASSES, hf_dims, optimize_model
from modelexport.runtime.session import create_session
from tests.optimize.conftest import bert_feeds

TESTED_PASSES = {"ort", "transformer_fusion", "fp16", "simplify"}
#: max abs diff vs the input model: fp32 rewrites, and float16 compute.
ATOL_FP32, ATOL_FP16 = 1e-4, 2e-2

CASES = {
    "basic": dict(level="basic"),
    "extended": dict(level="extended"),
    "all": dict(level="all"),
    "fusion": dict(level="disable", transformer_fusion=True),
    "fp16": dict(level="disable", fp16=True),
    "simplify": dict(level="disable", simplify=True),
    "everything": dict(level="extended", transformer_fusion=True, simplify=True),
}


def _max_diff(a: Path, b: Path) -> float:
    feeds = bert_feeds(2, seed=3)
    ya = create_session(a)[0].run(None, feeds)
    yb = create_session(b)[0].run(None, feeds)
    return max(float(np.abs(u - v.astype(np.float32)).max()) for u, v in zip(ya, yb, strict=True))


@pytest.mark.must
def test_every_pass_has_a_test() -> None:
    assert set(GRAPH_PASSES) == TESTED_PASSES


@pytest.mark.must
@pytest.mark.parametrize("case", list(CASES))
def test_optimize_keeps_tags_outputs_and_metadata(tiny_bert_onnx: Path, tmp_path: Path, case: str) -> None:
    out = tmp_path / "opt.onnx"
    result = optimize_model(tiny_bert_onnx, out, **CASES[case])
    model = onnx.load(out)
    tags = [{p.key: p.value for p in n.metadata_props}.get(TAG_KEY) for n in model.graph.node]
    assert result.coverage["coverage_pct"] == 100.0 and all(tags)
    assert _max_diff(tiny_bert_onnx, out) <= (ATOL_FP16 if case == "fp16" else ATOL_FP32)
    before, after = read_metadata(tiny_bert_onnx), read_metadata(out)
    assert set(before) <= set(after) and after["modelexport.optimization"]["level"] == CASES[case]["level"]
    side = json.loads((tmp_path / "opt_hierarchy.json").read_text())
    assert len(side["nodes"]) == len(model.graph.node) and side["coverage"]["coverage_pct"] == 100.0
    if case == "fp16":
        assert "slower than float32 on CPU" in result.passes[0].record["stats"]["warning"]


@pytest.mark.must
@pytest.mark.parametrize(("engine", "count"), [("onnxscript", "matched"), ("ort", "fused")])
def test_fused_nodes_get_the_common_ancestor_of_what_they_replaced(
    tiny_bert_onnx: Path, tmp_path: Path, engine: str, count: str
) -> None:
    out = tmp_path / "opt.onnx"
    result = optimize_model(  # kept fused (the GPU choice) to check the fused node's tag
        tiny_bert_onnx,
        out,
        level="none",
        transformer_fusion=True,
        fusion_engine=engine,
        skip_norm_fusion=True,
    )
    stats = result.passes[0].record["stats"]
    assert (
        stats[count]["skip_layer_normalization" if engine == "onnxscript" else "SkipLayerNormalization"] == 4
    )
    src = onnx.load(tiny_bert_onnx)
    ln_tags = [
        {p.key: p.value for p in n.metadata_props}[TAG_KEY]
        for n in src.graph.node
        if n.op_type == "LayerNormalization"
    ]
    fused = [
        {p.key: p.value for p in n.metadata_props}[TAG_KEY]
        for n in onnx.load(out).graph.node
        if n.op_type == "SkipLayerNormalization"
    ]
    assert len(fused) == 4
    # a residual Add + LayerNorm live in one BertLayer submodule (BertSelfOutput / BertOutput)
    for tag in fused:
        assert "/BertLayer." in tag and tag.count("/") >= 4, tag
        assert any(common_ancestor({tag, ln}) == tag for ln in ln_tags)


@pytest.mark.sanity
def test_num_heads_and_hidden_size_come_from_the_embedded_config(tiny_bert_onnx: Path) -> None:
    assert hf_dims(onnx.load(tiny_bert_onnx)) == (2, 32)


@pytest.mark.sanity
def test_bad_input_raises_typed_errors(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="level must be one of"):
        optimize_model(tiny_bert_onnx, tmp_path / "o.onnx", level="max")
    with pytest.raises(ConfigError, match="nothing to do"):
        optimize_model(tiny_bert_onnx, tmp_path / "o.onnx", level="none")
    with pytest.raises(OnnxFileError):
        optimize_model(tmp_path / "missing.onnx", tmp_path / "o.onnx")
    assert not list(tmp_path.iterdir())


@pytest.mark.integration
#: ORT's gpt2 fusion raises IndexError on dynamo graphs (onnx_model_gpt2.py), wrapped as OptimizationError.
@pytest.mark.parametrize(("name", "fusion"), [("gpt2", False), ("vit", True)])
def test_other_architectures_keep_full_tag_coverage(
    export_cache: object, tmp_path: Path, name: str, fusion: bool
) -> None:
    from modelexport.optimize.quantization import quantize
    from tests.models.hf_models import tiny_hf_model

    src = Path(export_cache.get(f"tiny_{name}", lambda: tiny_hf_model(name)).onnx_path)
    q = quantize(src, tmp_path / "q.onnx", mode="dynamic", progress=False)
    o = optimize_model(src, tmp_path / "o.onnx", level="extended", transformer_fusion=fusion, model_type=name)
    assert q.coverage["coverage_pct"] == 100.0 and o.coverage["coverage_pct"] == 100.0
    assert sum(q.quantized_per_module.values()) > 0


@pytest.mark.regression
def test_fusion_family_comes_from_the_embedded_config_with_a_recorded_fallback(
    export_cache: Any, tmp_path: Path
) -> None:
    """Engine ort, no --model-type: ORT's family named by the embedded config is tried first; when ORT's
    specialised fusion crashes on the graph (gpt2 on dynamo exports), the generic family runs and the
    failure is recorded."""
    from modelexport.optimize.graph import optimize_model
    from tests.models.hf_models import tiny_hf_model

    stats = {}
    for name in ("vit", "gpt2"):
        exported = export_cache.get(
            f"hf-{name}", lambda n=name: tiny_hf_model(n), exporter="dynamo", verify_topology=True
        )
        result = optimize_model(
            exported.onnx_path,
            tmp_path / name / f"{name}.onnx",  # each model's package files in a folder of its own
            level="extended",
            transformer_fusion=True,
            fusion_engine="ort",
        )
        fusion = result.to_dict()["passes"][0]
        stats[name] = fusion["stats"]["ort"]
        assert fusion["name"] == "transformer_fusion" and fusion["retag"]["coverage_pct"] == 100.0
    assert stats["vit"]["model_type"] == "vit" and "failed_model_types" not in stats["vit"]
    assert stats["gpt2"]["model_type"] in ("gpt2", "bert")
    if stats["gpt2"]["model_type"] == "bert":
        assert "gpt2" in stats["gpt2"]["failed_model_types"]
