"""Cached attention -> ONNX ``Attention`` (opset 23): exact for grouped heads, a past and any padding.

The graphs here are the dynamo exporter's decomposition of one cached self-attention, written by hand with
static shapes: ``Concat(past, new)`` (the presents), the key/value heads repeated, the key transposed, scaled
dot-product attention with ``Where(mask, 0, lowest float)`` added.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelexport.optimize.cached_attention import ATTENTION_OPSET, fuse_cached_attention
from modelexport.runtime.session import create_session

B, S, P, D = 2, 3, 4, 8
T = P + S
LOWEST = float(np.finfo(np.float32).min)


def _repeat(cache: str, out: str, heads: int, kv_heads: int, axis: int) -> tuple[list[Any], list[Any]]:
    """``cache`` (B, kv_heads, T, D) -> (B, heads, T, D): Unsqueeze at ``axis`` (2: each key/value head
    serves consecutive query heads, as transformers' repeat_kv; 1: the heads tiled), Expand, Reshape."""
    wide = [B, kv_heads, heads // kv_heads, T, D] if axis == 2 else [B, heads // kv_heads, kv_heads, T, D]
    nodes = [
        helper.make_node("Unsqueeze", [cache, f"axis{axis}"], [f"{out}_1"]),
        helper.make_node("Expand", [f"{out}_1", f"{out}_wide"], [f"{out}_5d"]),
        helper.make_node("Reshape", [f"{out}_5d", f"{out}_shape"], [out]),
    ]
    inits = [
        helper.make_tensor(f"{out}_wide", TensorProto.INT64, [5], wide),
        helper.make_tensor(f"{out}_shape", TensorProto.INT64, [4], [B, heads, T, D]),
    ]
    return nodes, inits


def _model(
    heads: int = 4,
    kv_heads: int = 2,
    axis: int = 2,
    transpose_3d: bool = True,
    nan_guard: bool = True,
    low: float = LOWEST,
) -> onnx.ModelProto:
    """One cached attention, decomposed: inputs q, k, v, past_key, past_value, mask (B, 1, S, T) bool;
    outputs y, present_key, present_value."""
    scale = (1.0 / np.sqrt(D)) ** 0.5
    keys, values = ("keys", "values") if heads != kv_heads else ("present_key", "present_value")
    nodes = [
        helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=-2),
        helper.make_node("Concat", ["past_value", "v"], ["present_value"], axis=-2),
    ]
    inits = [
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("low", TensorProto.FLOAT, [], [low]),
        helper.make_tensor("flat", TensorProto.INT64, [3], [-1, T, D]),
        helper.make_tensor("back", TensorProto.INT64, [4], [B, heads, D, T]),
    ]
    if heads != kv_heads:
        for cache, out in (("present_key", keys), ("present_value", values)):
            more_nodes, more_inits = _repeat(cache, out, heads, kv_heads, axis)
            nodes, inits = nodes + more_nodes, inits + more_inits
    if transpose_3d:
        nodes += [
            helper.make_node("Reshape", [keys, "flat"], ["k3"]),
            helper.make_node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
            helper.make_node("Reshape", ["k3t", "back"], ["kt"]),
        ]
    else:
        nodes.append(helper.make_node("Transpose", [keys], ["kt"], perm=[0, 1, 3, 2]))
    nodes += [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Mul", ["kt", "scale"], ["ks"]),
        helper.make_node("Where", ["mask", "zero", "low"], ["bias"]),
        helper.make_node("MatMul", ["qs", "ks"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
    ]
    if nan_guard:
        nodes += [
            helper.make_node("IsNaN", ["weights"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "weights"], ["guarded"]),
        ]
    nodes.append(helper.make_node("MatMul", ["guarded" if nan_guard else "weights", values], ["y"]))
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "cached_attention",
        [
            helper.make_tensor_value_info("q", f32, [B, heads, S, D]),
            helper.make_tensor_value_info("k", f32, [B, kv_heads, S, D]),
            helper.make_tensor_value_info("v", f32, [B, kv_heads, S, D]),
            helper.make_tensor_value_info("past_key", f32, [B, kv_heads, P, D]),
            helper.make_tensor_value_info("past_value", f32, [B, kv_heads, P, D]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [B, 1, S, T]),
        ],
        [
            helper.make_tensor_value_info("y", f32, [B, heads, S, D]),
            helper.make_tensor_value_info("present_key", f32, [B, kv_heads, T, D]),
            helper.make_tensor_value_info("present_value", f32, [B, kv_heads, T, D]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    ir_model = ir.from_proto(model)
    common_passes.ShapeInferencePass()(ir_model)  # as onnxscript's fusions leave the graph
    counts = fuse_cached_attention(ir_model)
    return ir.to_proto(ir_model), counts


#: Padding of row 1 (positions of past + new): in the past only (left padding after a first step), at the
#: end (right), or reaching into the new tokens (a left-padded first step: its padding queries see no key).
PADDING = {"past": slice(0, 3), "right": slice(T - 2, T), "into_new": slice(0, P + 1)}


def _feeds(heads: int, kv_heads: int, padding: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Random q/k/v and past; the causal mask over past + new with row 1 padded as ``PADDING[padding]``."""
    rng = np.random.default_rng(seed)
    valid = np.ones((B, T), bool)
    valid[1, PADDING[padding]] = False
    causal = np.arange(T)[None, :] <= (P + np.arange(S))[:, None]
    shapes = {"q": heads, "k": kv_heads, "v": kv_heads}
    feeds = {name: rng.standard_normal((B, h, S, D)).astype(np.float32) for name, h in shapes.items()}
    for name in ("past_key", "past_value"):
        feeds[name] = rng.standard_normal((B, kv_heads, P, D)).astype(np.float32)
    feeds["mask"] = causal[None, None] & valid[:, None, None, :]
    return feeds


def _reference(feeds: dict[str, np.ndarray], heads: int) -> list[np.ndarray]:
    """numpy, float64: query head h reads key/value head h // (heads / kv_heads); a query that sees no
    key gives a zero row (ONNX ``Attention``'s definition)."""
    keys = np.concatenate([feeds["past_key"], feeds["k"]], 2)
    values = np.concatenate([feeds["past_value"], feeds["v"]], 2)
    group = heads // keys.shape[1]
    scores = feeds["q"].astype(np.float64) @ np.repeat(keys, group, 1).transpose(0, 1, 3, 2) / np.sqrt(D)
    weights = np.where(feeds["mask"], np.exp(scores - scores.max(-1, keepdims=True)), 0.0)
    weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-300)
    return [weights @ np.repeat(values, group, 1), keys, values]


def _max_diff(a: list[np.ndarray], b: list[np.ndarray], rows: np.ndarray) -> float:
    """Largest difference of the attention on ``rows`` (B, 1, S, 1) and of the presents."""
    diffs = [np.abs(np.asarray(a[0], np.float64) - b[0]) * rows]
    diffs += [np.abs(np.asarray(x, np.float64) - y) for x, y in zip(a[1:], b[1:], strict=True)]
    return max(float(d.max()) for d in diffs)


def _seen(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """(B, 1, S, 1): the query rows that see at least one key."""
    return feeds["mask"].any(-1, keepdims=True)


@pytest.mark.sanity
@pytest.mark.parametrize("padding", list(PADDING))
def test_onnx_attention_on_cpu_equals_numpy_with_grouped_heads_a_past_and_padding(padding: str) -> None:
    """The semantics the fusion relies on, on ONNX Runtime's CPU kernel: 4 query heads over 2 key/value
    heads (h reads h // 2), the past in front of the new keys, keys removed where the mask is False, a
    zero row where a query sees no key."""
    fused, counts = _fused(_model())
    assert counts == {"kv_cache_gqa": 1, "kv_cache_mha": 0}
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    assert {o.domain: o.version for o in fused.opset_import}[""] == ATTENTION_OPSET
    assert [o.name for o in fused.graph.output] == ["y", "present_key", "present_value"]
    feeds = _feeds(4, 2, padding)
    outputs, expected = create_session(fused)[0].run(None, feeds), _reference(feeds, 4)
    assert _max_diff(outputs, expected, np.ones_like(_seen(feeds))) < 1e-5
    np.testing.assert_array_equal(outputs[1], expected[1])  # present = concat(past, new), exactly


@pytest.mark.parametrize(
    "variant",
    [
        dict(transpose_3d=False),
        dict(nan_guard=False),
        dict(heads=2, kv_heads=2),
        dict(low=-np.inf),
        dict(low=-1e4),  # not the lowest float: passed as an additive float mask, still exact
    ],
    ids=["4d-transpose", "no-nan-guard", "equal-heads", "minus-inf", "float-mask"],
)
def test_every_exporter_variant_fuses_into_one_equal_node(variant: dict[str, Any]) -> None:
    model = _model(**variant)
    fused, counts = _fused(model)
    heads, kv_heads = variant.get("heads", 4), variant.get("kv_heads", 2)
    assert sum(counts.values()) == 1 and counts["kv_cache_mha"] == (heads == kv_heads)
    assert [n.op_type for n in fused.graph.node if n.op_type not in ("Cast", "Where")] == ["Attention"]
    for padding in PADDING:
        feeds = _feeds(heads, kv_heads, padding)
        expected = create_session(model)[0].run(None, feeds)
        assert _max_diff(create_session(fused)[0].run(None, feeds), expected, _seen(feeds)) < 1e-5, padding


@pytest.mark.sanity
def test_only_queries_that_see_no_key_differ_from_the_decomposed_graph() -> None:
    """A left-padded first step: the decomposed graph averages every value on a padding query (the mask
    adds the same lowest float to all its scores), ``Attention`` writes zeros. Every other row is equal."""
    model = _model()
    feeds = _feeds(4, 2, "into_new")
    expected = create_session(model)[0].run(None, feeds)
    outputs = create_session(_fused(model)[0])[0].run(None, feeds)
    blind = ~_seen(feeds)[..., 0]  # (B, 1, S)
    assert blind.sum() == 1 and _max_diff(outputs, expected, _seen(feeds)) < 1e-5
    np.testing.assert_array_equal(outputs[0][np.broadcast_to(blind, outputs[0].shape[:3])], 0.0)
    assert np.abs(expected[0][np.broadcast_to(blind, outputs[0].shape[:3])]).max() > 0.01


@pytest.mark.sanity
def test_heads_repeated_in_another_order_are_left_alone() -> None:
    """Tiled heads (query head h reads key/value head h % 2) are not ``Attention``'s grouping: no rewrite,
    and the opset stays."""
    fused, counts = _fused(_model(axis=1))
    assert sum(counts.values()) == 0
    assert "Attention" not in {n.op_type for n in fused.graph.node}
    assert {o.domain: o.version for o in fused.opset_import}[""] == 20
