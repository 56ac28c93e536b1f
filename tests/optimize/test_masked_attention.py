"""Masked attention -> ONNX ``Attention`` (opset 23): exact for grouped heads, with or without a past, and
any padding, padding queries that see no key included.

The graphs here are the dynamo exporter's decomposition of one self-attention, written by hand with static
shapes: ``Concat(past, new)`` (the presents; absent without a cache), the key/value heads repeated, the key
transposed, scaled dot-product attention with ``Where(mask, 0, lowest float)`` added.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelexport.optimize.masked_attention import ATTENTION_OPSET, fuse_masked_attention
from modelexport.runtime.session import create_session

B, S, P, D = 2, 3, 4, 8
T = P + S
LOWEST = float(np.finfo(np.float32).min)


def _repeat(
    cache: str, out: str, heads: int, kv_heads: int, axis: int, total: int
) -> tuple[list[Any], list[Any]]:
    """``cache`` (B, kv_heads, T, D) -> (B, heads, T, D): Unsqueeze at ``axis`` (2: each key/value head
    serves consecutive query heads, as transformers' repeat_kv; 1: the heads tiled), Expand, Reshape."""
    T = total  # noqa: N806 - the attended length, as in the shapes above
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
    cached: bool = True,
) -> onnx.ModelProto:
    """One attention, decomposed: inputs q, k, v, past_key, past_value (``cached``), mask (B, 1, S, T) bool;
    outputs y, present_key, present_value (``cached``; without a cache T = S and k, v are attended)."""
    scale = (1.0 / np.sqrt(D)) ** 0.5
    attended = ("present_key", "present_value") if cached else ("k", "v")
    keys, values = ("keys", "values") if heads != kv_heads else attended
    total = T if cached else S
    nodes = (
        [
            helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=-2),
            helper.make_node("Concat", ["past_value", "v"], ["present_value"], axis=-2),
        ]
        if cached
        else []
    )
    inits = [
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("low", TensorProto.FLOAT, [], [low]),
        helper.make_tensor("flat", TensorProto.INT64, [3], [-1, total, D]),
        helper.make_tensor("back", TensorProto.INT64, [4], [B, heads, D, total]),
    ]
    if heads != kv_heads:
        for cache, out in zip(attended, (keys, values), strict=True):
            more_nodes, more_inits = _repeat(cache, out, heads, kv_heads, axis, total)
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
    past = [helper.make_tensor_value_info(n, f32, [B, kv_heads, P, D]) for n in ("past_key", "past_value")]
    presents = [helper.make_tensor_value_info(n, f32, [B, kv_heads, T, D]) for n in attended]
    graph = helper.make_graph(
        nodes,
        "masked_attention",
        [
            helper.make_tensor_value_info("q", f32, [B, heads, S, D]),
            helper.make_tensor_value_info("k", f32, [B, kv_heads, S, D]),
            helper.make_tensor_value_info("v", f32, [B, kv_heads, S, D]),
            *(past if cached else []),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [B, 1, S, total]),
        ],
        [helper.make_tensor_value_info("y", f32, [B, heads, S, D]), *(presents if cached else [])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    ir_model = ir.from_proto(model)
    common_passes.ShapeInferencePass()(ir_model)  # as onnxscript's fusions leave the graph
    counts = fuse_masked_attention(ir_model)
    return ir.to_proto(ir_model), counts


#: Padding of row 1 (positions of past + new): in the past only (left padding after a first step), at the
#: end (right), or reaching into the new tokens (a left-padded first step: its padding queries see no key).
PADDING = {"past": slice(0, 3), "right": slice(T - 2, T), "into_new": slice(0, P + 1)}


def _feeds(
    heads: int, kv_heads: int, padding: str, seed: int = 0, cached: bool = True
) -> dict[str, np.ndarray]:
    """Random q/k/v and past; the causal mask over past + new with row 1 padded as ``PADDING[padding]``
    (without a cache: over the new tokens, the padding's part there)."""
    rng = np.random.default_rng(seed)
    valid = np.ones((B, T), bool)
    valid[1, PADDING[padding]] = False
    causal = np.arange(T)[None, :] <= (P + np.arange(S))[:, None]
    shapes = {"q": heads, "k": kv_heads, "v": kv_heads}
    feeds = {name: rng.standard_normal((B, h, S, D)).astype(np.float32) for name, h in shapes.items()}
    for name in ("past_key", "past_value"):
        feeds[name] = rng.standard_normal((B, kv_heads, P, D)).astype(np.float32)
    feeds["mask"] = causal[None, None] & valid[:, None, None, :]
    if not cached:
        feeds = {k: v for k, v in feeds.items() if not k.startswith("past")}
        feeds["mask"] = feeds["mask"][..., P:]
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


def _attention_nodes(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model``'s nodes, less those that restore padding queries' rows (a mean of the
    values where a query sees no key) and constants."""
    fixup = {
        "Cast",
        "ReduceMax",
        "Equal",
        "ReduceMean",
        "Unsqueeze",
        "Expand",
        "Reshape",
        "Where",
        "Constant",
    }
    return [n.op_type for n in model.graph.node if n.op_type not in fixup]


NO_MATCH = {"kv_cache_gqa": 0, "kv_cache_mha": 0, "no_cache_gqa": 0, "no_cache_mha": 0}


@pytest.mark.sanity
@pytest.mark.parametrize("padding", list(PADDING))
def test_onnx_attention_on_cpu_equals_numpy_with_grouped_heads_a_past_and_padding(padding: str) -> None:
    """The semantics the fusion relies on, on ONNX Runtime's CPU kernel: 4 query heads over 2 key/value
    heads (h reads h // 2), the past in front of the new keys, keys removed where the mask is False; a
    query that sees no key is a zero row in ``Attention``, restored to the decomposed graph's mean."""
    fused, counts = _fused(_model())
    assert counts == {**NO_MATCH, "kv_cache_gqa": 1}
    assert _attention_nodes(fused) == ["Attention"]
    assert {o.domain: o.version for o in fused.opset_import}[""] == ATTENTION_OPSET
    assert [o.name for o in fused.graph.output] == ["y", "present_key", "present_value"]
    feeds = _feeds(4, 2, padding)
    outputs, expected = create_session(fused)[0].run(None, feeds), _reference(feeds, 4)
    assert _max_diff(outputs, expected, _seen(feeds)) < 1e-5
    np.testing.assert_array_equal(outputs[1], expected[1])  # present = concat(past, new), exactly


@pytest.mark.parametrize(
    "variant",
    [
        dict(transpose_3d=False),
        dict(nan_guard=False),
        dict(heads=2, kv_heads=2),
        dict(cached=False),
        dict(cached=False, heads=2, kv_heads=2),
        dict(low=-np.inf),
        dict(low=-1e4),  # not the lowest float: passed as an additive float mask, still exact
    ],
    ids=[
        "4d-transpose",
        "no-nan-guard",
        "equal-heads",
        "no-cache",
        "no-cache-equal-heads",
        "minus-inf",
        "float-mask",
    ],
)
def test_every_exporter_variant_fuses_into_one_equal_node(variant: dict[str, Any]) -> None:
    """Equal to the decomposed graph on every row, padding queries that see no key included (their mean of
    the values; -inf with a NaN guard gives zeros in both), except a float mask's or -inf's unguarded rows."""
    model = _model(**variant)
    fused, counts = _fused(model)
    heads, kv_heads = variant.get("heads", 4), variant.get("kv_heads", 2)
    kind = (
        f"{'kv_cache' if variant.get('cached', True) else 'no_cache'}_{'mha' if heads == kv_heads else 'gqa'}"
    )
    assert counts == {**NO_MATCH, kind: 1}
    assert _attention_nodes(fused) == ["Attention"]
    every_row = variant.get("low", LOWEST) == LOWEST or variant.get("nan_guard", True)
    for padding in PADDING:
        feeds = _feeds(heads, kv_heads, padding, cached=variant.get("cached", True))
        expected = create_session(model)[0].run(None, feeds)
        rows = np.ones_like(_seen(feeds)) if every_row and variant.get("low") != -1e4 else _seen(feeds)
        assert _max_diff(create_session(fused)[0].run(None, feeds), expected, rows) < 1e-5, padding


@pytest.mark.sanity
@pytest.mark.parametrize("cached", [True, False])
def test_queries_that_see_no_key_equal_the_decomposed_graph(cached: bool) -> None:
    """A left-padded first step: the decomposed graph averages every value on a padding query (the mask
    adds the same lowest float to all its scores); ``Attention`` writes zeros, and the fusion puts the
    mean back, so the rows are equal too."""
    model = _model(cached=cached)
    feeds = _feeds(4, 2, "into_new", cached=cached)
    expected = create_session(model)[0].run(None, feeds)
    outputs = create_session(_fused(model)[0])[0].run(None, feeds)
    blind = ~_seen(feeds)[..., 0]  # (B, 1, S)
    assert (
        blind.sum() >= 1 and np.abs(expected[0][np.broadcast_to(blind, expected[0].shape[:3])]).max() > 0.01
    )
    assert _max_diff(outputs, expected, np.ones_like(_seen(feeds))) < 1e-5


@pytest.mark.sanity
def test_heads_repeated_in_another_order_attend_as_plain_heads() -> None:
    """Tiled heads (query head h reads key/value head h % 2) are not ``Attention``'s grouping: the repeated
    keys and values are attended as plain heads (equal), the presents still come from the Concats."""
    model = _model(axis=1)
    fused, counts = _fused(model)
    assert counts == {**NO_MATCH, "no_cache_mha": 1}
    assert "Concat" in {n.op_type for n in fused.graph.node}
    for padding in PADDING:
        feeds = _feeds(4, 2, padding)
        expected = create_session(model)[0].run(None, feeds)
        got = create_session(fused)[0].run(None, feeds)
        assert _max_diff(got, expected, np.ones_like(_seen(feeds))) < 1e-5, padding
