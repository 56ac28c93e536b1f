"""int8 dynamic quantization and -O2 on the decoder-with-past graph keep every tag and keep generating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from modelexport.inference import pipeline
from modelexport.metadata.schema import KEY_GENERATION
from modelexport.metadata.store import read_metadata
from modelexport.optimize import OptimizeConfig, optimize_model, quantize


def _first_logits(pipe: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    scores, _ = pipe._run(pipe._step_feeds(ids, mask, ids.shape[1]), pipe.cache.empty(len(ids)))
    return scores


def test_int8_and_o2_keep_tags_cache_and_generation(llama_with_past: Any, tmp_path: Path) -> None:
    _, out, _ = llama_with_past
    fp32 = pipeline("text-generation", model=out)
    ids, mask = fp32.encode(["hello world", "the quick brown fox"])
    reference = _first_logits(fp32, ids, mask)
    greedy = fp32.generate(ids, mask, fp32.settings(max_new_tokens=6))

    q = quantize(out / "model.onnx", tmp_path / "int8" / "model.onnx", mode="dynamic")
    assert q.coverage["coverage_pct"] == 100.0 and q.nodes_after != q.nodes_before
    o2 = optimize_model(out / "model.onnx", tmp_path / "o2" / "model.onnx", OptimizeConfig.preset("O2"))
    assert o2.coverage["coverage_pct"] == 100.0
    # the probe gives the cache a past and the mask past + new positions, padded right and left: the rotary
    # and RMSNorm fusions are checked on it and kept (attention itself is not matched by onnxscript here)
    stats = o2.passes[0].record["stats"]["onnxscript"]
    assert stats["fusions"] == "all" and stats["max_abs_diff"] <= 1e-4
    assert {"rotary_embedding", "rms_normalization", "skip_rms_normalization"} <= set(stats["matched"])
    ops = {n.op_type for n in onnx.load(tmp_path / "o2" / "model.onnx", load_external_data=False).graph.node}
    # the skip form is split again for the CPU (faster there): RMS normalization stays fused
    assert {
        "RotaryEmbedding",
        "SimplifiedLayerNormalization",
    } <= ops and "SkipSimplifiedLayerNormalization" not in ops
    for folder in ("int8", "o2"):
        assert read_metadata(tmp_path / folder / "model.onnx")[KEY_GENERATION]["cache"]["layers"] == 2
        assert (tmp_path / folder / "generation_config.json").is_file()

    fused = pipeline("text-generation", model=tmp_path / "o2")
    np.testing.assert_allclose(_first_logits(fused, ids, mask), reference, atol=1e-4)
    np.testing.assert_array_equal(fused.generate(ids, mask, fused.settings(max_new_tokens=6)), greedy)
    int8 = pipeline("text-generation", model=tmp_path / "int8")
    logits = _first_logits(int8, ids, mask)
    assert np.abs(logits - reference).max() < 0.1 * np.abs(reference).max()  # int8 error, not garbage
    assert int8.generate(ids, mask, int8.settings(max_new_tokens=6)).shape == greedy.shape


def test_int8_after_o2_quantizes_every_weight_matmul(llama_with_past: Any, tmp_path: Path) -> None:
    """ORT's -O2 optimizer writes FusedMatMul(transB) for MatMul(x, Transpose(W)); ORT's quantizer skips
    that op, so it goes back to MatMul first: every constant-weight product is int8 after -O2 + int8."""
    _, out, _ = llama_with_past
    optimize_model(out / "model.onnx", tmp_path / "o2" / "model.onnx", OptimizeConfig.preset("O2"))
    o2 = onnx.load(tmp_path / "o2" / "model.onnx")
    weights = {t.name for t in o2.graph.initializer}
    products = [n for n in o2.graph.node if n.op_type in ("MatMul", "FusedMatMul") and n.input[1] in weights]
    q = quantize(tmp_path / "o2" / "model.onnx", tmp_path / "int8" / "model.onnx", mode="dynamic")
    assert q.coverage["coverage_pct"] == 100.0
    quantized = onnx.load(tmp_path / "int8" / "model.onnx")
    consts = {t.name for t in quantized.graph.initializer}
    ops = [n.op_type for n in quantized.graph.node]
    assert not [n for n in quantized.graph.node if n.op_type == "FusedMatMul" and n.input[1] in consts]
    assert ops.count("MatMulInteger") == len(products) > 0
    fp32, int8 = pipeline("text-generation", model=out), pipeline("text-generation", model=tmp_path / "int8")
    ids, mask = fp32.encode(["hello world", "the quick brown fox"])
    reference = _first_logits(fp32, ids, mask)
    assert np.abs(_first_logits(int8, ids, mask) - reference).max() < 0.1 * np.abs(reference).max()
