"""Fuse masked attention (a decoder's, with or without a key/value cache) into ONNX's ``Attention`` (opset 23).

The dynamo exporter writes each cached self-attention as ``Concat(past, new)`` for keys and values (the
``present.*`` outputs; without a cache the new keys and values are attended alone), the key/value heads
repeated for grouped-query attention (``Unsqueeze`` ->
``Expand`` -> ``Reshape``), and scaled dot-product attention decomposed into ``MatMul`` / ``Softmax``
with the padding + causal mask added as ``Where(mask, 0, lowest float)``. ONNX's ``Attention``
(opset 23) defines exactly that computation in one node: 4-D query / key / value with fewer key/value
heads than query heads (query head ``h`` reads key/value head ``h // group``, the order the repeat
writes), ``past_key`` / ``past_value`` concatenated in front of the new keys and values as the
``present_key`` / ``present_value`` outputs, and a boolean ``attn_mask`` that removes a key where it is
False. The mask is the graph's own (B, 1, S, past + S) mask, so any padding, left or right, in the past
or in the new tokens, and any cache length give the same scores as the decomposed graph.

Why this op and not ``com.microsoft.GroupQueryAttention`` (ONNX Runtime 1.32, CPU): GroupQueryAttention
assumes each row's valid cache positions are contiguous from 0 (``seqlens_k``); it is exact with left
padding only with the mask passed as ``attention_bias``, ``seqlens_k`` set to the full length and
``query_seqlens`` given (else it refuses a batch of several new tokens after a past), and then it is
slower than the decomposed graph on one thread: 11.6 vs 8.4 us for a tiny decoding step, 220 vs 145 us
for a 32-token prefill with 32 heads (``Attention`` 1.4-1.8x faster than the decomposed ops).
``com.microsoft.MultiHeadAttention`` has no grouped key/value heads.

A query row whose keys are all masked (a padding position of a left-padded first step) is a zero row
in ``Attention`` (and in every ORT attention kernel) given a boolean mask or the lowest float, while the
decomposed graph averages all values there (its mask adds the same lowest float to every score of the
row). A float32 graph gets an additive mask of half the lowest float instead (one ``Where`` for every
layer): ONNX Runtime adds it like any value, every score of a blind row rounds to it, and softmax
averages the values as the decomposed graph does. Other float types keep the boolean mask, and the
rewrite puts the mean back (a ``Where`` per layer on the rows the mask leaves blind, computed once per
mask; issue 26: on a 12-layer int4 decoder those 60 nodes ran on every decoding step). Either way the
fused graph equals its input on every row, padding included, and ``fusion.fuse_for_ort``'s probe checks
it on left-padded batches with and without a past. A mask of -inf with the exporter's NaN guard gives
zeros in both.

The default-domain opset is raised to 23 only when a match was rewritten (onnxscript's version
converter; ops between opset 18 and 23 keep their semantics or get an adapter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchContext, RewriterContext
    from onnxscript.rewriter._pattern_ir import ValuePattern
    from onnxscript.rewriter.pattern import OpsetPatternBuilder

    #: What a match binds to a name: a value of the graph (None for an optional input it lacks), or the tag an
    #: ``OrValue`` alternative set (``"Mul"``, ``True``).
    _Binding = ir.Value | str | bool | None

__all__ = ["ATTENTION_OPSET", "ATTENTION_RULES", "fuse_masked_attention"]

#: The default-domain opset that defines ``Attention`` with grouped heads, past and present.
ATTENTION_OPSET = 23
#: Lowest default-domain opset onnxscript's version converter raises to ``ATTENTION_OPSET``.
_MIN_CONVERTIBLE_OPSET = 18
#: The additive mask value of a float32 ``Attention``: half the lowest float. ONNX Runtime's kernels take the
#: lowest float (and -inf) as "removed" and write a zero row where a query sees no key; any other value is
#: added to the scores, so such a row's scores all round to this value and softmax averages the values, as
#: the decomposed graph does with its lowest float. One mask for every layer instead of a per-layer fix.
_SOFT_LOW = -(2.0**127)
#: Counter names, as reported by ``fusion.fuse_for_ort``: with a key/value cache or without, key/value heads
#: repeated (grouped) or not.
ATTENTION_RULES = ("kv_cache_gqa", "kv_cache_mha", "no_cache_gqa", "no_cache_mha")


def _scaled(op: OpsetPatternBuilder, x: ValuePattern, scale: ValuePattern, tag: str) -> ValuePattern:
    from onnxscript.rewriter import pattern

    return pattern.OrValue(
        [op.Mul(x, scale), op.Div(x, scale), x], tag_var=tag, tag_values=["Mul", "Div", "None"]
    )


def _repeated_heads(op: OpsetPatternBuilder, cache: ValuePattern, name: str) -> ValuePattern:
    """``cache`` (B, Hkv, T, D) with each head repeated (B, Hkv * G, T, D), or ``cache`` itself."""
    from onnxscript.rewriter import pattern

    wide = op.Expand(op.Unsqueeze(cache, [2]), pattern.ANY_VALUE, _outputs=[f"{name}_5d"])
    repeated = op.Reshape(wide, pattern.ANY_VALUE, _outputs=[f"{name}_repeated"])
    return pattern.OrValue([repeated, cache], tag_var=f"{name}_grouped", tag_values=[True, False])


def _target(
    op: OpsetPatternBuilder,
    query: ValuePattern,
    key: ValuePattern,
    value: ValuePattern,
    past_key: ValuePattern,
    past_value: ValuePattern,
    mask: ValuePattern,
    query_scale: ValuePattern,
    key_scale: ValuePattern,
    qk_scale: ValuePattern,
) -> ValuePattern:
    """The cached attention as the dynamo exporter decomposes it (onnxscript's SDPA variants of the
    key transpose and scaling, the optional NaN guard of a boolean mask)."""
    from onnxscript.rewriter import pattern

    present_key = pattern.OrValue(  # a graph without a cache attends to the new keys alone
        [op.Concat(past_key, key, _outputs=["present_key"]), key],
        tag_var="cached_key",
        tag_values=[True, False],
    )
    present_value = pattern.OrValue(
        [op.Concat(past_value, value, _outputs=["present_value"]), value],
        tag_var="cached_value",
        tag_values=[True, False],
    )
    keys = _repeated_heads(op, present_key, "keys")
    values = _repeated_heads(op, present_value, "values")
    keys_3d = op.Reshape(keys, pattern.ANY_VALUE, _outputs=["keys_3d"])
    keys_t = pattern.OrValue(
        [
            op.Transpose(keys, perm=[0, 1, 3, 2]),
            op.Reshape(op.Transpose(keys_3d, perm=[0, 2, 1]), pattern.ANY_VALUE, _outputs=["keys_t"]),
        ],
        tag_var="transpose_3d",
        tag_values=[False, True],
    )
    scores = op.MatMul(
        _scaled(op, query, query_scale, "query_scaling"), _scaled(op, keys_t, key_scale, "key_scaling")
    )
    weights = op.Softmax(op.Add(_scaled(op, scores, qk_scale, "qk_scaling"), mask), axis=-1)
    weights = pattern.OrValue([op.Where(op.IsNaN(weights), 0.0, weights), weights])
    return op.MatMul(weights, values)


def _dims(value: ir.Value | None, rank: int) -> list[Any] | None:
    """``value``'s dims when it has ``rank`` dims, each known (an int or a named symbol); else None."""
    shape = None if value is None else value.shape
    if shape is None or shape.rank() != rank:
        return None
    dims = list(shape)
    return dims if all(isinstance(d, int) or d.value is not None for d in dims) else None


def _scale(bindings: dict[str, _Binding]) -> float | None:
    """The product of the matched scalings (None when one is not a constant scalar)."""
    from onnxscript.rewriter import _ir_utils

    scale = 1.0
    for tag, name in (
        ("query_scaling", "query_scale"),
        ("key_scaling", "key_scale"),
        ("qk_scaling", "qk_scale"),
    ):
        kind = bindings.get(tag, "None")
        if kind == "None":
            continue
        factor = _ir_utils.get_singleton_value(bindings.get(name))
        if not isinstance(factor, float | int) or factor == 0:
            return None
        scale *= factor if kind == "Mul" else 1.0 / factor
    return float(scale) if math.isfinite(scale) and scale > 0 else None


def _masked_value(mask: ir.Value) -> float:
    """The value ``Where(c, 0, low)`` adds to a removed key's score: call it where :func:`_boolean_mask`
    found ``c``, which checked ``low`` is a constant (the lowest float or -inf)."""
    from onnxscript.rewriter import _ir_utils

    return float(_ir_utils.get_numpy_value(mask.producer().inputs[2]).item())


def _boolean_mask(mask: ir.Value) -> ir.Value | None:
    """The boolean mask ``c`` of an additive mask ``Where(c, 0, lowest float or -inf)`` (else None):
    ``Attention`` takes it as is, and removes a key exactly where the added value did."""
    import numpy as np
    import onnx_ir as ir
    from onnxscript.rewriter import _ir_utils

    node = mask.producer()
    if node is None or node.op_type != "Where" or node.domain != "" or len(node.inputs) != 3:
        return None
    condition, kept, masked = node.inputs
    if condition is None or condition.dtype != ir.DataType.BOOL or mask.dtype is None:
        return None
    zero, low = _ir_utils.get_numpy_value(kept), _ir_utils.get_numpy_value(masked)
    if zero is None or low is None or zero.size != 1 or low.size != 1 or zero.item() != 0:
        return None
    lowest = float(np.finfo(mask.dtype.numpy()).min) if mask.dtype.is_floating_point() else 0.0
    return condition if float(low.item()) <= lowest < 0 else None


def _attended(bindings: dict[str, _Binding], cache: str) -> _Binding:
    """What the queries attend to, (B, Hkv, T, D): the present (past + new) of a cache, else the new keys
    or values."""
    return bindings.get(f"present_{cache}") if bindings.get(f"cached_{cache}") else bindings.get(cache)


def _grouping_ok(bindings: dict[str, _Binding], cache: str, heads: int) -> bool:
    """The cache (B, Hkv, T, D) reaches the scores as (B, heads, T, D): repeated with each key/value head
    serving ``heads // Hkv`` consecutive query heads (Unsqueeze at 2 -> Expand -> Reshape), or as is."""
    present = _dims(_attended(bindings, cache), 4)
    if present is None or not isinstance(present[1], int):
        return False
    if not bindings.get(f"{cache}s_grouped"):
        return present[1] == heads
    wide, repeated = _dims(bindings.get(f"{cache}s_5d"), 5), _dims(bindings.get(f"{cache}s_repeated"), 4)
    kv_heads = present[1]
    return (
        wide is not None
        and repeated is not None
        and heads % kv_heads == 0
        and wide == [present[0], kv_heads, heads // kv_heads, *present[2:]]
        and repeated == [present[0], heads, *present[2:]]
    )


def _transpose_ok(bindings: dict[str, _Binding]) -> bool:
    """The 3-D form of the key transpose swaps exactly the last two axes of the repeated keys."""
    if not bindings.get("transpose_3d"):
        return True
    keys = _dims(bindings.get("keys_repeated") or _attended(bindings, "key"), 4)
    flat, swapped = _dims(bindings.get("keys_3d"), 3), _dims(bindings.get("keys_t"), 4)
    return (
        keys is not None
        and flat is not None
        and swapped is not None
        and flat[1:] == keys[2:]
        and swapped == [keys[0], keys[1], keys[3], keys[2]]
    )


def _concat_on_sequence(value: ir.Value | None) -> bool:
    node = None if value is None else value.producer()
    axis = None if node is None else node.attributes.get("axis")
    return axis is not None and axis.as_int() in (-2, 2)


def _condition(context: MatchContext, **bindings: _Binding) -> bool:
    """Shapes, axes and constants that make the matched ops equal to ``Attention``."""
    query = _dims(bindings.get("query"), 4)
    cached = bool(bindings.get("cached_key"))
    if query is None or not isinstance(query[1], int) or cached != bool(bindings.get("cached_value")):
        return False
    inputs = ("key", "value", "past_key", "past_value") if cached else ("key", "value")
    return (
        all(_dims(bindings.get(name), 4) is not None for name in inputs)
        and (not cached or _concat_on_sequence(bindings.get("present_key")))
        and (not cached or _concat_on_sequence(bindings.get("present_value")))
        and _grouping_ok(bindings, "key", query[1])
        and _grouping_ok(bindings, "value", query[1])
        and _transpose_ok(bindings)
        and _scale(bindings) is not None
        and bindings["mask"].dtype is not None
        and bindings["mask"].dtype.is_floating_point()
    )


@dataclass
class _Rewrites:
    """What each rewrite made: the new ``Attention``'s present outputs replace the matched ``Concat``s'
    after the rule set ran (the pattern has one output, the attention, so matching stays linear)."""

    presents: list[tuple[ir.Value, ir.Value]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ATTENTION_RULES, 0))
    #: boolean mask -> its (B, 1, S, 1) "sees no key" rows, computed once for every layer that reads it
    blind: dict[ir.Value, ir.Value] = field(default_factory=dict)
    #: boolean mask -> its float32 additive form (:data:`_SOFT_LOW` where False), once for every layer
    soft: dict[ir.Value, ir.Value] = field(default_factory=dict)

    def _mask(self, op: RewriterContext, mask: ir.Value, keep: ir.Value | None) -> tuple[ir.Value, bool]:
        """What ``Attention`` reads as its mask, and whether the rows that see no key still need their
        mean of the values put back (:func:`_unattended_rows_average`)."""
        import onnx_ir as ir

        if keep is None:
            return mask, False
        if not math.isfinite(_masked_value(mask)):
            return keep, False  # -inf: NaN rows in the decomposed graph, zeros with its NaN guard
        if mask.dtype != ir.DataType.FLOAT:
            return keep, True
        if keep not in self.soft:
            zero, low = op.Constant(value_float=0.0), op.Constant(value_float=_SOFT_LOW)
            self.soft[keep] = op.Where(keep, zero, low)
        return self.soft[keep], False

    def replace(self, op: RewriterContext, **bindings: _Binding) -> ir.Value:
        mask = bindings["mask"]
        keep = _boolean_mask(mask)
        attn_mask, restore = self._mask(op, mask, keep)
        cached = bool(bindings.get("cached_key"))
        past = [bindings["past_key"], bindings["past_value"]] if cached else []
        outputs = op.Attention(
            bindings["query"],
            bindings["key"],
            bindings["value"],
            attn_mask,
            *past,
            scale=_scale(bindings),
            _outputs=3 if cached else 1,
        )
        output = outputs[0] if cached else outputs
        if cached:
            self.presents += [(bindings["present_key"], outputs[1]), (bindings["present_value"], outputs[2])]
        grouped = "gqa" if bindings.get("keys_grouped") else "mha"
        self.counts[f"{'kv_cache' if cached else 'no_cache'}_{grouped}"] += 1
        if restore:
            values = outputs[2] if cached else bindings["value"]
            if keep not in self.blind:
                self.blind[keep] = _blind_rows(op, keep)
            output = _unattended_rows_average(op, output, self.blind[keep], values, bindings)
        return output

    def move_presents(self) -> None:
        """Graph outputs and every other use of the matched ``Concat``s read the ``Attention``'s presents,
        under the same names (``present.*`` keep their names)."""
        import onnx_ir as ir

        for old, new in self.presents:
            name, old.name = old.name, None
            ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
            new.name = name


def _blind_rows(op: RewriterContext, keep: ir.Value) -> ir.Value:
    """(B, 1, S, 1): the query rows of boolean mask ``keep`` (B, 1, S, T) that see no key."""
    import onnx_ir as ir

    seen = op.ReduceMax(op.Cast(keep, to=ir.DataType.FLOAT), op.Constant(value_ints=[-1]), keepdims=1)
    return op.Equal(seen, op.Constant(value_float=0.0))


def _unattended_rows_average(
    op: RewriterContext, output: ir.Value, blind: ir.Value, values: ir.Value, bindings: dict[str, _Binding]
) -> ir.Value:
    """``output`` with each query row that sees no key (``blind``) replaced by the mean of the values, as
    the decomposed graph computes it: its mask adds the same lowest float to every score of such a row, so
    softmax weighs every key alike; ``Attention`` (every ONNX Runtime kernel) writes zeros there. Keeps the
    fusion exact on a left-padded first step, whose padding positions see no key."""
    mean = op.ReduceMean(values, op.Constant(value_ints=[2]), keepdims=1)  # (B, Hkv, 1, D)
    heads, kv_heads = _dims(bindings["query"], 4)[1], _dims(_attended(bindings, "value"), 4)[1]
    if heads != kv_heads:  # each key/value head serves heads // kv_heads consecutive query heads
        wide = op.Constant(value_ints=[1, 1, heads // kv_heads, 1, 1])
        mean = op.Reshape(
            op.Expand(op.Unsqueeze(mean, op.Constant(value_ints=[2])), wide),
            op.Constant(value_ints=[0, heads, 1, -1]),
        )
    return op.Where(blind, mean, output)


def fuse_masked_attention(model: ir.Model) -> dict[str, int]:
    """Rewrite each cached attention of ``model`` (in place) into ``Attention``; returns the counts per
    kind (``CACHED_ATTENTION_RULES``). Nothing changes in a graph whose opset cannot be raised to 23."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes
    from onnxscript.rewriter import pattern
    from onnxscript.version_converter import convert_version

    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    if opset < _MIN_CONVERTIBLE_OPSET:
        return dict.fromkeys(ATTENTION_RULES, 0)
    common_passes.ShapeInferencePass()(model)  # the rule checks heads and ranks on inferred shapes
    rewrites = _Rewrites()
    rule = pattern.RewriteRule(
        _target, rewrites.replace, _condition, name="CachedAttention", remove_nodes=False
    )
    if pattern.RewriteRuleSet([rule]).apply_to_model(model):
        rewrites.move_presents()
        if opset < ATTENTION_OPSET:
            convert_version(model, ATTENTION_OPSET)
        ir.passes.Sequential(common_passes.RemoveUnusedNodesPass(), common_passes.TopologicalSortPass())(
            model
        )
    return dict(rewrites.counts)
