"""-O2 on dynamo exports: onnxscript's fusions give Attention / SkipLayerNorm / BiasGelu (encoders, ViT) and
RMSNorm (decoders); every fused node tagged, outputs equal to the unfused model on a padded batch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.hierarchy.tags import TAG_KEY, is_within
from modelexport.metadata import read_metadata
from modelexport.optimize.config import OptimizeConfig
from modelexport.optimize.fusion import VERIFY_ATOL, probe_feeds
from modelexport.optimize.graph import optimize_model
from modelexport.runtime.session import create_session

#: The export's default parity tolerance (ExportConfig.atol).
ATOL = 1e-4


def _padded_feeds(model: onnx.ModelProto, batch: int, seq: int, vocab: int, seed: int) -> dict[str, Any]:
    """Random ids, zero token types, the mask of each row after the first shortened by its index."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for inp in model.graph.input:
        if inp.name == "pixel_values":
            feeds[inp.name] = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        elif "mask" in inp.name:
            mask = np.ones((batch, seq), np.int64)
            for row in range(1, batch):
                mask[row, seq - min(row, seq - 1) :] = 0
            feeds[inp.name] = mask
        elif inp.name == "input_ids":
            feeds[inp.name] = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
        else:
            feeds[inp.name] = np.zeros((batch, seq), np.int64)
    return feeds


def _max_diff(a: Path, b: Path, vocab: int) -> float:
    """Largest |difference| of all outputs at batch 1 and at a padded batch of 4."""
    model = onnx.load(a, load_external_data=False)
    worst = 0.0
    for batch, seq in ((1, 7), (4, 12)):
        feeds = _padded_feeds(model, batch, seq, vocab, seed=batch)
        ya, yb = (create_session(p)[0].run(None, feeds) for p in (a, b))
        worst = max(worst, *(float(np.abs(u - v).max()) for u, v in zip(ya, yb, strict=True)))
    return worst


def _tags(model: onnx.ModelProto, op: str) -> list[str]:
    return [{p.key: p.value for p in n.metadata_props}[TAG_KEY] for n in model.graph.node if n.op_type == op]


def _check_o2(src: Path, out: Path, vocab: int) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """-O2 ``src`` into ``out``; tags on every node, outputs within the export tolerance, metadata kept."""
    result = optimize_model(src, out, OptimizeConfig.preset("O2"))
    model = onnx.load(out)
    assert result.coverage["coverage_pct"] == 100.0
    assert all({p.key for p in n.metadata_props} >= {TAG_KEY} for n in model.graph.node)
    assert _max_diff(src, out, vocab) <= ATOL
    meta = read_metadata(out)
    assert set(read_metadata(src)) <= set(meta) and meta["modelexport.optimization"]["preset_name"] == "O2"
    side = json.loads(out.with_name(out.stem + "_hierarchy.json").read_text())
    assert len(side["nodes"]) == len(model.graph.node)
    assert [p.name for p in result.passes] == ["transformer_fusion", "ort"]
    return model, result.passes[0].record["stats"]


@pytest.mark.must
def test_o2_fuses_attention_on_the_tiny_bert_dynamo_export(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    model, stats = _check_o2(tiny_bert_onnx, tmp_path / "o2.onnx", vocab=99)
    assert stats["engine"] == "auto" and "ort" not in stats  # ORT's optimizer adds nothing here
    assert stats["matched"] == {
        "attention": 2,
        "multi_head_attention": 2,
        "sdpa": 2,
        "skip_layer_normalization": 4,
        "bias_gelu": 2,
        "mask_index": 2,
    }
    assert stats["skip_layer_norm"] == {"split_for_cpu": 4, "kept": 0}  # faster on ORT's CPU provider
    ops = Counter(n.op_type for n in model.graph.node)
    assert (ops["Attention"], ops["SkipLayerNormalization"], ops["BiasGelu"], ops["Softmax"]) == (2, 0, 2, 0)
    assert ops["LayerNormalization"] == 5  # the embeddings' and two per layer
    # the padding mask reaches each Attention as ORT's raw mask_index: no 4-D bias is built per run
    attention = [n for n in model.graph.node if n.op_type == "Attention"]
    assert all(len(n.input) == 4 and n.input[3] for n in attention)
    assert not {"Where", "Expand"} & set(ops)
    # each fused Attention replaced one layer's q/k/v projections and SDPA: tagged with that attention module
    src = onnx.load(tiny_bert_onnx)
    softmax_tags = _tags(src, "Softmax")
    for tag in _tags(model, "Attention"):
        assert sum(is_within(s, tag) for s in softmax_tags) == 1, tag
        assert tag.count("/") >= 4, tag
    assert stats["onnxscript"]["max_abs_diff"] <= VERIFY_ATOL


@pytest.mark.sanity
def test_probe_feeds_pad_the_second_row_and_stay_inside_tables(tiny_bert_onnx: Path) -> None:
    feeds = probe_feeds(onnx.load(tiny_bert_onnx))
    assert feeds["attention_mask"].tolist() == [[1] * 8, [1] * 5 + [0] * 3]
    assert feeds["token_type_ids"].max() < 2 and feeds["input_ids"].shape == (2, 8)


@pytest.mark.sanity
def test_probe_feeds_give_dynamic_images_a_size_deep_cnns_take() -> None:
    """An image's dynamic height/width (named as Optimum names them) gets 224, not a sequence's 8."""
    from onnx import TensorProto, helper

    dims = ["batch_size", 3, "height", "width"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["pixel_values"], ["out"])],
        "g",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)],
    )
    assert probe_feeds(helper.make_model(graph))["pixel_values"].shape == (2, 3, 224, 224)


@pytest.mark.integration
def test_o2_fuses_the_real_minilm_export(minilm_export: Any, tmp_path: Path) -> None:
    model, stats = _check_o2(Path(minilm_export.onnx_path), tmp_path / "o2.onnx", vocab=30522)
    ops = Counter(n.op_type for n in model.graph.node)
    assert (ops["Attention"], ops["SkipLayerNormalization"], ops["BiasGelu"]) == (6, 0, 6)
    assert ops["LayerNormalization"] == 13 and stats["skip_layer_norm"]["split_for_cpu"] == 12
    assert stats["matched"]["attention"] == 6 and len(model.graph.node) <= 80


@pytest.mark.integration
def test_o2_fuses_vit(export_cache: Any, tmp_path: Path) -> None:
    from tests.models.hf_models import tiny_hf_model

    src = Path(export_cache.get("tiny_vit", lambda: tiny_hf_model("vit")).onnx_path)
    model, stats = _check_o2(src, tmp_path / "o2.onnx", vocab=1)
    assert stats["matched"]["attention"] == 2 and "Attention" in {n.op_type for n in model.graph.node}


@pytest.mark.integration
@pytest.mark.compat
def test_o2_fuses_a_decoder_without_cache_exactly(export_cache: Any, tmp_path: Path) -> None:
    """On transformers 4's graph onnxscript's GroupQueryAttention / rotary rules ignore the mask and the batch
    of a decoder exported without a KV cache; the probe rejects them, and the normalization fusions go with
    each attention as ONNX ``Attention`` over the graph's own mask (``optimize/masked_attention.py``). On
    transformers 5's the full set passes the probe. Either way: equal on left-padded rows too, the padding
    queries that see no key included."""
    from tests.models.hf_models import tiny_hf_model

    # the grid's own export of the tiny Llama (tests/export/test_grid.py): no second export
    src = Path(
        export_cache.get(
            "hf-llama", lambda: tiny_hf_model("llama"), exporter="dynamo", verify_topology=True
        ).onnx_path
    )
    out = tmp_path / "o2.onnx"
    model, stats = _check_o2(src, out, vocab=99)
    fusions = stats["onnxscript"]["fusions"]
    if fusions == "safe+attention":  # transformers 4's graph: onnxscript's GQA rule drops its mask
        assert "group_query_attention" in stats["onnxscript"]["rejected"]["all"]
    else:  # transformers 5's graph (plain SDPA, rotary angles as a product): onnxscript's set is exact on it
        assert fusions == "all" and {"sdpa", "rotary_embedding"} <= set(stats["matched"])
    assert {"rms_normalization": 5, "skip_rms_normalization": 4}.items() <= stats["matched"].items()
    ops = Counter(n.op_type for n in model.graph.node)  # the skip form is split again for the CPU
    attention = ops["Attention"] + ops["MultiHeadAttention"] + ops["GroupQueryAttention"]
    assert (attention, ops["Softmax"]) == (2, 0)
    assert (ops["SkipSimplifiedLayerNormalization"], ops["SimplifiedLayerNormalization"]) == (0, 5)
    for left in (False, True):  # each row after the first padded at the end, then at the start
        feeds = _padded_feeds(onnx.load(src, load_external_data=False), 4, 12, 99, seed=4)
        if left:
            feeds["attention_mask"] = feeds["attention_mask"][:, ::-1].copy()
        ya, yb = (create_session(p)[0].run(None, feeds) for p in (src, out))
        assert max(float(np.abs(u - v).max()) for u, v in zip(ya, yb, strict=True)) <= ATOL, left
