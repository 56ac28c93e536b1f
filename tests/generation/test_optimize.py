"""int8 dynamic quantization and -O2 on the decoder-with-past graph keep every tag and keep generating;
-O2 fuses each layer's cached attention into ONNX ``Attention``, exact on left-padded batches."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.hierarchy.tags import TAG_KEY
from modelexport.inference import pipeline
from modelexport.inference.pipelines.generation import _SharedCache
from modelexport.metadata.schema import KEY_GENERATION
from modelexport.metadata.store import read_metadata
from modelexport.optimize import OptimizeConfig, WeightOnlyConfig, optimize_model, quantize
from modelexport.optimize.graph import OptimizeResult
from modelexport.runtime.session import create_session

from .conftest import export_causal_lm

PROMPTS = ["hello world", "the quick brown fox"]  # two lengths: the first row is left-padded


@pytest.fixture(scope="module")
def llama_o2(llama_with_past: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OptimizeResult]:
    """(folder, result) of -O2 on the tiny Llama with a cache, once for this module."""
    out = tmp_path_factory.mktemp("o2")
    result = optimize_model(
        llama_with_past[1] / "model.onnx", out / "model.onnx", OptimizeConfig.preset("O2")
    )
    return out, result


def _first_logits(pipe: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    scores, _ = pipe._run(pipe._step_feeds(ids, mask, ids.shape[1]), pipe.cache.empty(len(ids)))
    return scores


def _tag(node: onnx.NodeProto) -> str:
    return {p.key: p.value for p in node.metadata_props}[TAG_KEY]


def test_int8_and_o2_keep_tags_cache_and_generation(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult], tmp_path: Path
) -> None:
    _, out, _ = llama_with_past
    fp32 = pipeline("text-generation", model=out)
    ids, mask = fp32.encode(PROMPTS)
    reference = _first_logits(fp32, ids, mask)
    greedy = fp32.generate(ids, mask, fp32.settings(max_new_tokens=6))

    q = quantize(out / "model.onnx", tmp_path / "int8" / "model.onnx", mode="dynamic")
    assert q.coverage["coverage_pct"] == 100.0 and q.nodes_after != q.nodes_before
    o2_dir, o2 = llama_o2
    assert o2.coverage["coverage_pct"] == 100.0
    # the probe gives the cache a past and the mask past + new positions, padded right and left: the rotary,
    # RMSNorm and cached-attention fusions are checked on it and kept
    stats = o2.passes[0].record["stats"]["onnxscript"]
    assert stats["fusions"] == "all" and stats["max_abs_diff"] <= 1e-4
    assert {"rotary_embedding", "rms_normalization", "skip_rms_normalization"} <= set(stats["matched"])
    ops = Counter(n.op_type for n in onnx.load(o2_dir / "model.onnx", load_external_data=False).graph.node)
    # a graph with a cache keeps the RMS skip form fused (its one-token steps run it faster than Add + norm):
    # the 4 residual joins, the first norm (on the embeddings) plain
    # the rotary embeddings run inside each layer's GroupQueryAttention
    assert ops["RotaryEmbedding"] == 0 and ops["GroupQueryAttention"] == 2
    assert ops["SimplifiedLayerNormalization"] == 1
    assert ops["SkipSimplifiedLayerNormalization"] == 4
    assert o2.passes[0].record["stats"]["skip_layer_norm"] == {"split_for_cpu": 0, "kept": 4}
    for folder in (tmp_path / "int8", o2_dir):
        assert read_metadata(folder / "model.onnx")[KEY_GENERATION]["cache"]["layers"] == 2
        assert (folder / "generation_config.json").is_file()

    fused = pipeline("text-generation", model=o2_dir)
    np.testing.assert_allclose(_first_logits(fused, ids, mask), reference, atol=1e-4)
    np.testing.assert_array_equal(fused.generate(ids, mask, fused.settings(max_new_tokens=6)), greedy)
    int8 = pipeline("text-generation", model=tmp_path / "int8")
    logits = _first_logits(int8, ids, mask)
    assert np.abs(logits - reference).max() < 0.1 * np.abs(reference).max()  # int8 error, not garbage
    assert int8.generate(ids, mask, int8.settings(max_new_tokens=6)).shape == greedy.shape


def test_int8_after_o2_quantizes_every_weight_matmul(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult], tmp_path: Path
) -> None:
    """ORT's -O2 optimizer writes FusedMatMul(transB) for MatMul(x, Transpose(W)); ORT's quantizer skips
    that op, so it goes back to MatMul first: every constant-weight product is int8 after -O2 + int8.
    ONNX's ``Attention`` (no weights) stays as it is: ORT's quantizer would write a broken QAttention."""
    _, out, _ = llama_with_past
    o2 = onnx.load(llama_o2[0] / "model.onnx")
    weights = {t.name for t in o2.graph.initializer}
    products = [n for n in o2.graph.node if n.op_type in ("MatMul", "FusedMatMul") and n.input[1] in weights]
    q = quantize(llama_o2[0] / "model.onnx", tmp_path / "int8" / "model.onnx", mode="dynamic")
    assert q.coverage["coverage_pct"] == 100.0
    quantized = onnx.load(tmp_path / "int8" / "model.onnx")
    consts = {t.name for t in quantized.graph.initializer}
    ops = [n.op_type for n in quantized.graph.node]
    assert not [n for n in quantized.graph.node if n.op_type == "FusedMatMul" and n.input[1] in consts]
    assert ops.count("MatMulInteger") == len(products) > 0
    assert ops.count("GroupQueryAttention") == 2 and "QAttention" not in ops
    fp32, int8 = pipeline("text-generation", model=out), pipeline("text-generation", model=tmp_path / "int8")
    ids, mask = fp32.encode(PROMPTS)
    reference = _first_logits(fp32, ids, mask)
    assert np.abs(_first_logits(int8, ids, mask) - reference).max() < 0.1 * np.abs(reference).max()


def test_o2_fuses_one_attention_per_layer_tagged_with_its_module(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult]
) -> None:
    """Each layer's cached attention becomes one ``GroupQueryAttention`` (via ONNX ``Attention``, opset 23)
    that writes that layer's ``present.*`` under the same names and carries the tag of the module that wrote
    them; the metadata says one buffer may serve as past and present."""
    src = onnx.load(llama_with_past[1] / "model.onnx", load_external_data=False)
    fused = onnx.load(llama_o2[0] / "model.onnx", load_external_data=False)
    stats = llama_o2[1].passes[0].record["stats"]
    assert stats["matched"]["group_query_attention"] == 2 and stats["matched"]["shared_cache_attention"] == 2
    assert stats["onnxscript"]["rules"]["kv_cache_gqa"] == 2
    assert {o.domain: o.version for o in fused.opset_import}[""] == 23
    attention = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2 and Counter(n.op_type for n in fused.graph.node)["Softmax"] == 0
    writers = {o: n for n in src.graph.node for o in n.output}
    for layer, node in enumerate(attention):
        assert list(node.output[1:]) == [f"present.{layer}.key", f"present.{layer}.value"]
        assert _tag(node) == _tag(writers[f"present.{layer}.key"])  # the layer's attention module
    assert [o.name for o in fused.graph.output] == [o.name for o in src.graph.output]
    assert [i.name for i in fused.graph.input] == [i.name for i in src.graph.input]
    assert read_metadata(llama_o2[0] / "model.onnx")[KEY_GENERATION]["cache"]["shared_buffer"] is True
    assert "shared_buffer" not in read_metadata(llama_with_past[1] / "model.onnx")[KEY_GENERATION]["cache"]


def test_o2_attention_reads_the_projections_without_head_reshapes(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult]
) -> None:
    """Each layer's attention takes (B, S, heads * D) query / key / value with its head counts (the config's 2
    and 1): the model's own head split and merge (a ``Reshape`` and ``Transpose`` per projection and for the
    output, eight nodes a layer) are gone; then the rotary embeddings and the cache go into one
    ``GroupQueryAttention``; logits stay equal (the test above and the next one)."""
    src = Counter(
        n.op_type for n in onnx.load(llama_with_past[1] / "model.onnx", load_external_data=False).graph.node
    )
    fused = onnx.load(llama_o2[0] / "model.onnx", load_external_data=False)
    assert llama_o2[1].passes[0].record["stats"]["matched"]["attention_3d"] == 2
    ops = Counter(n.op_type for n in fused.graph.node)
    assert src["Transpose"] >= 8 and ops["Transpose"] == 0
    assert ops["GroupQueryAttention"] == 2 and ops["Attention"] == ops["RotaryEmbedding"] == 0
    for node in (n for n in fused.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: a.i for a in node.attribute}
        assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == (2, 1, 1)


def test_o2_attention_is_exact_on_every_position_of_a_left_padded_first_step(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult]
) -> None:
    """The fused graph rotates a token by its index in the cache. Fed those positions, the unfused graph gives
    the same logits and cache on every position, padding included (a padding query that sees no key keeps
    the graph's mean of the values). Fed transformers' positions (a left-padded row counts from its first
    token), the logits of every real token are the same too: a rotary score depends only on distances."""
    pipe = pipeline("text-generation", model=llama_with_past[1])
    ids, mask = pipe.encode(PROMPTS)
    assert mask[0, 0] == 0 and mask[1].all()
    feeds = pipe._step_feeds(ids, mask, ids.shape[1])
    feeds.update(zip(pipe.cache.in_names, (v.numpy() for v in pipe.cache.empty(len(ids))), strict=True))
    indices = {**feeds, "position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()}
    unfused = create_session(llama_with_past[1] / "model.onnx")[0]
    fused = create_session(llama_o2[0] / "model.onnx")[0]
    names = [o.name for o in unfused.get_outputs()]
    padded = ~mask.astype(bool)
    worst_padding = 0.0
    for name, a, b in zip(names, unfused.run(None, indices), fused.run(names, feeds), strict=True):
        if name != "logits":  # cache (B, heads, S, D) -> (B, S, heads, D): positions first, as logits
            a, b = a.transpose(0, 2, 1, 3), b.transpose(0, 2, 1, 3)
        np.testing.assert_allclose(b, a, atol=1e-4, err_msg=name)
        worst_padding = max(worst_padding, float(np.abs(a[padded]).max()))
    assert worst_padding > 0.01  # the padding rows hold values (a mean), not zeros
    logits = unfused.run(["logits"], feeds)[0]
    np.testing.assert_allclose(fused.run(["logits"], feeds)[0][~padded], logits[~padded], atol=1e-4)
    assert (
        np.abs(unfused.run(["present.0.key"], feeds)[0] - fused.run(["present.0.key"], feeds)[0]).max() > 0.01
    )


def test_o2_decodes_into_one_cache_buffer_with_the_unfused_tokens(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline binds one zeroed buffer per layer as past and present of the -O2 graph (its metadata says
    the graph allows it) and ONNX Runtime writes each step's positions into it: greedy and beam tokens of a
    left-padded batch equal the unfused graph's, whose cache grows by concatenation, also when the buffers
    start 2 positions past the prompt and have to grow twice; the buffer holds every real token's key, zeros
    past them."""
    plain = pipeline("text-generation", model=llama_with_past[1])
    fused = pipeline("text-generation", model=llama_o2[0])
    assert fused.cache.shared and not plain.cache.shared
    ids, mask = plain.encode(PROMPTS)
    for options in (dict(max_new_tokens=7), dict(max_new_tokens=5, num_beams=2)):
        settings = plain.settings(**options)
        expected = plain.generate(ids, mask, settings)
        np.testing.assert_array_equal(fused.generate(ids, mask, settings), expected)
        with monkeypatch.context() as patch:
            patch.setattr(_SharedCache, "INITIAL_NEW", 2)
            np.testing.assert_array_equal(fused.generate(ids, mask, settings), expected)
    state = fused._begin(ids, mask, None, room=ids.shape[1] + 3)
    assert isinstance(state, _SharedCache) and state.buffers[0].shape[2] == ids.shape[1] + 3
    for step in range(3):
        new = ids.shape[1] if step == 0 else 1
        _, state = fused._advance(ids, mask, new, state)
        ids = np.concatenate([ids, np.full((len(ids), 1), 7)], axis=1)
        mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], axis=1)
    written = np.abs(state.buffers[0]).sum(axis=(1, 3))  # (batch, positions)
    real = mask[:, :-1].astype(bool)  # the last token is fed, not yet run
    assert (written[:, : real.shape[1]][real] > 0).all() and not written[:, real.shape[1] :].any()


def test_int4_after_o2_gives_the_attention_its_projections_packed(
    llama_with_past: Any, llama_o2: tuple[Path, OptimizeResult], tmp_path: Path
) -> None:
    """``--weights int4`` joins each layer's q/k/v projections into one ``MatMulNBits`` whose output is the
    ``GroupQueryAttention``'s packed query (its columns q, k, v in that order; no ``Split``); the package keeps
    the shared-buffer record and its genai_config turns onnxruntime-genai's shared buffer on; the first
    logits stay within int4's error of the unfused fp32 graph's."""
    result = quantize(llama_o2[0], tmp_path / "int4" / "model.onnx", WeightOnlyConfig(progress=False))
    assert result.coverage["coverage_pct"] == 100.0
    graph = onnx.load(tmp_path / "int4" / "model.onnx", load_external_data=False).graph
    writers = {o: n for n in graph.node for o in n.output}
    for node in (n for n in graph.node if n.op_type == "GroupQueryAttention"):
        assert writers[node.input[0]].op_type == "MatMulNBits" and list(node.input[1:3]) == ["", ""]
        width = {a.name: a.i for a in writers[node.input[0]].attribute}["N"]
        assert width == (2 + 2 * 1) * 16  # 2 query heads, then 1 key and 1 value head, of 16
    assert Counter(n.op_type for n in graph.node)["Split"] == 2  # the MLPs' gate/up only
    assert read_metadata(tmp_path / "int4" / "model.onnx")[KEY_GENERATION]["cache"]["shared_buffer"] is True
    genai = json.loads((tmp_path / "int4" / "genai_config.json").read_text())
    assert genai["search"]["past_present_share_buffer"] is True
    plain, int4 = (
        pipeline("text-generation", model=llama_with_past[1]),
        pipeline("text-generation", model=tmp_path / "int4"),
    )
    ids, mask = plain.encode(PROMPTS)
    reference = _first_logits(plain, ids, mask)
    # int4's error on these 16-wide projections, the bound test_weight_only holds round-to-nearest to
    assert np.abs(_first_logits(int4, ids, mask) - reference).max() < 0.2 * np.abs(reference).max()
    assert int4.generate(ids, mask, int4.settings(max_new_tokens=6)).shape == (len(ids), ids.shape[1] + 6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, matched",
    [("qwen2", "group_query_attention"), ("phi3", "group_query_attention"), ("gpt2", "multi_head_attention")],
)
def test_o2_fuses_the_cached_attention_of_other_decoders(
    name: str, matched: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """Grouped heads (Qwen2, Phi3 configs) and equal heads (GPT-2) fuse one ``Attention`` per layer; greedy
    tokens of a left-padded batch equal the unfused graph's."""
    _, out, _ = export_causal_lm(name, minilm_dir, tmp_path)
    result = optimize_model(out / "model.onnx", tmp_path / "o2" / "model.onnx", OptimizeConfig.preset("O2"))
    assert (
        result.coverage["coverage_pct"] == 100.0 and result.passes[0].record["stats"]["matched"][matched] == 2
    )
    ops = Counter(
        n.op_type for n in onnx.load(tmp_path / "o2" / "model.onnx", load_external_data=False).graph.node
    )
    # rotary decoders: GroupQueryAttention; GPT-2 (learned positions): ONNX Attention
    assert ops["Attention"] + ops["GroupQueryAttention"] == 2 and ops["Softmax"] == 0
    assert ops["GroupQueryAttention"] == (2 if matched == "group_query_attention" else 0)
    assert result.passes[0].record["stats"]["matched"]["attention_3d"] == 2 and ops["Transpose"] == 0
    plain, fused = pipeline("text-generation", model=out), pipeline("text-generation", model=tmp_path / "o2")
    ids, mask = plain.encode(PROMPTS)
    np.testing.assert_allclose(_first_logits(fused, ids, mask), _first_logits(plain, ids, mask), atol=1e-4)
    settings = plain.settings(max_new_tokens=8)
    np.testing.assert_array_equal(fused.generate(ids, mask, settings), plain.generate(ids, mask, settings))
