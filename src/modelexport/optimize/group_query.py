"""A decoder's cached attention as ONNX Runtime's ``GroupQueryAttention``, so one buffer can be past and present.

After :mod:`.masked_attention` and :mod:`.attention_heads` each layer of a rotary decoder runs two
``RotaryEmbedding`` nodes and an ONNX ``Attention`` that concatenates the past with the new keys and values:
every step copies the whole cache into a new ``present``. ``com.microsoft.GroupQueryAttention`` does the
rotation, the grouped heads and the cache in one kernel, and when the caller binds the same buffer as
``past_*`` and ``present_*`` it writes only the new positions (``past_present_share_buffer``, what
onnxruntime-genai runs). Issue 26, the 12-layer int4 decoder of ``benchmarks/generation.py``: 1.06x -> 1.005x
onnxruntime-genai's time per token at one thread, 1.15x -> 1.01x at two.

What the kernel is given, so that it computes what the graph did:

- **The mask.** The graph's own additive mask (causal and padding; a boolean one gets ``Where``) is the
  kernel's ``attention_bias``, with ``causal`` 0 and ``seqlens_k`` = the mask's length - 1 on every row: a
  row's keys sit at their index in the cache, padding anywhere is masked as before, and a query the mask
  leaves blind keeps the graph's mean of the values.
- **The positions.** The kernel rotates a prompt by ``positions[0, 0] + s`` for every row (ONNX Runtime's
  rule) and a new token by its own ``positions[b, 0]``. A prompt's rows are rotated by their index in the
  cache, so a kept token's position is ``position_ids`` plus its row's leading padding (transformers counts
  positions over kept tokens, padding at 1), a padded one's is its index. A rotary score depends only on
  the distance between query and key, so logits are exact for left padding, right padding (and the tokens
  generated after it) and no padding; the cache of a left-padded row holds its keys rotated by their index,
  equal under attention, not equal as numbers. A caller with other positions (packed sequences, offsets)
  gets other numbers.
- **The lengths.** The cos/sin tables the graph computed up to ``max(position_ids)`` run up to the mask's
  length, and every read of a cache input's length (``Shape`` on axis 2, for the padding mask) reads the
  mask's length minus the new tokens: a buffer longer than the cache changes nothing.

ONNX Runtime's CPU kernel takes several new tokens onto a non-empty cache for one row only, and head sizes
that are multiples of 16. Matched by structure, not names: an opset-23 ``Attention`` on 3-D projections
(``q_num_heads`` set) with a 4-D mask and ``is_causal`` 0, past and present that are graph inputs and
outputs, its query and key each from a ``RotaryEmbedding`` (com.microsoft, same position/cos/sin inputs,
full head width) nothing else reads, a 2-D ``position_ids`` input and a 2-D integer ``*mask*`` input; every
cached attention of the graph, or none. :func:`.fusion.fuse_for_ort` checks the result against its input on
a prompt padded left and right and the next token on each graph's own cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..metadata.schema import CACHE_INPUT_PREFIX

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

__all__ = ["GQA_RULE", "attention_as_gqa", "shares_cache_buffer"]

#: The counter name reported by ``fusion.fuse_for_ort``.
GQA_RULE = "gqa_shared_cache"
_ROTARY = ("com.microsoft", "RotaryEmbedding")
_GQA = ("com.microsoft", "GroupQueryAttention")
#: ONNX Runtime's CPU GroupQueryAttention rejects other head sizes.
_HEAD_MULTIPLE = 16


def _static(dim: object) -> int | None:
    return dim if isinstance(dim, int) else None


def _rotary(value: ir.Value | None, reader: ir.Node) -> ir.Node | None:
    node = value.producer() if value is not None else None
    if node is None or (node.domain, node.op_type) != _ROTARY or value.is_graph_output():
        return None
    return node if len(value.uses()) == 1 and value.uses()[0].node is reader else None


def _int_attr(node: ir.Node, name: str, default: int = 0) -> int:
    attr = node.attributes.get(name)
    return int(attr.as_int()) if attr is not None else default


def _mask_input(graph: ir.Graph) -> ir.Value | None:
    """The 2-D integer padding mask the graph takes (transformers' ``attention_mask``)."""
    import onnx_ir as ir

    found = [
        v
        for v in graph.inputs
        if "mask" in (v.name or "").lower()
        and v.shape is not None
        and v.shape.rank() == 2
        and v.dtype in (ir.DataType.INT64, ir.DataType.INT32)
    ]
    return found[0] if len(found) == 1 else None


def _angles_range(cos: ir.Value, position_ids: ir.Value) -> ir.Node | None:
    """The ``Range(0, max(position_ids) + 1)`` the cos table is computed over (onnxscript's cos/sin cache)."""
    stack, seen = [cos], set()
    while stack:
        value = stack.pop()
        node = value.producer() if value is not None else None
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "Range" and len(node.inputs) == 3 and node.inputs[1] is not None:
            end = node.inputs[1].producer()
            top = end.inputs[0].producer() if end is not None and end.op_type == "Add" else None
            if top is not None and top.op_type == "ReduceMax" and top.inputs[0] is position_ids:
                return node
        stack.extend(v for v in node.inputs if v is not None)
    return None


def _match(node: ir.Node, graph: ir.Graph) -> tuple[ir.Node, ir.Node, int] | None:
    """(query rotary, key rotary, head size) of an ``Attention`` the rewrite takes, else None."""
    if len(node.inputs) != 6 or len([v for v in node.outputs if v.uses() or v.is_graph_output()]) > 3:
        return None
    q, k, v, mask, past_k, past_v = node.inputs
    heads, kv_heads = _int_attr(node, "q_num_heads"), _int_attr(node, "kv_num_heads")
    if not heads or not kv_heads or heads % kv_heads or _int_attr(node, "is_causal"):
        return None
    if mask is None or mask.shape is None or mask.shape.rank() != 4:
        return None
    inputs = set(graph.inputs)
    if (
        past_k not in inputs
        or past_v not in inputs
        or not all(o.is_graph_output() for o in node.outputs[1:3])
    ):
        return None
    rq, rk = _rotary(q, node), _rotary(k, node)
    if rq is None or rk is None or list(rq.inputs[1:]) != list(rk.inputs[1:]) or len(rq.inputs) != 4:
        return None
    width = _static(rq.inputs[0].shape[2]) if rq.inputs[0].shape is not None else None
    cos = rq.inputs[2]
    half = _static(cos.shape[-1]) if cos is not None and cos.shape is not None else None
    if not width or width % heads or not half:
        return None
    head = width // heads
    if head % _HEAD_MULTIPLE or 2 * half != head or _int_attr(rq, "rotary_embedding_dim", head) != head:
        return None
    return rq, rk, head


def _step_values(
    graph: ir.Graph, mask: ir.Value, position_ids: ir.Value, first: ir.Node
) -> dict[str, ir.Value]:
    """Nodes before ``first`` computing what the kernel takes from the mask and the positions: the total
    length (int64 scalar ``total``, int32 ``total32``, 1-D ``total_1d``), the past length (1-D ``past_1d``),
    ``seqlens_k`` (int32, total - 1 on every row) and the rotary ``positions`` (see the module docstring)."""
    import numpy as np
    import onnx_ir as ir

    def const(name: str, array: np.ndarray) -> ir.Value:
        value = ir.val(name, const_value=ir.tensor(array, name=name))
        graph.register_initializer(value)
        return value

    one, axis0 = const("gqa_one", np.array([1], np.int64)), const("gqa_axis0", np.array([0], np.int64))
    step, axis1 = const("gqa_step", np.array(1, np.int64)), const("gqa_axis1", np.array([1], np.int64))
    end = const("gqa_end", np.array([np.iinfo(np.int64).max], np.int64))
    nodes = [
        total := ir.node("Shape", [mask], {"start": 1, "end": 2}, name="gqa_total"),
        rows := ir.node("Shape", [mask], {"start": 0, "end": 1}, name="gqa_rows"),
        new := ir.node("Shape", [position_ids], {"start": 1, "end": 2}, name="gqa_new_tokens"),
        past := ir.node("Sub", [total.outputs[0], new.outputs[0]], name="gqa_past_length"),
        last := ir.node("Sub", [total.outputs[0], one], name="gqa_last"),
        last32 := ir.node("Cast", [last.outputs[0]], {"to": ir.DataType.INT32}, name="gqa_last_int32"),
        seqlens := ir.node("Expand", [last32.outputs[0], rows.outputs[0]], name="gqa_seqlens_k"),
        scalar := ir.node("Squeeze", [total.outputs[0], axis0], name="gqa_total_scalar"),
        scalar32 := ir.node("Cast", [scalar.outputs[0]], {"to": ir.DataType.INT32}, name="gqa_total_int32"),
        # a row's leading padding (the index of its first kept position) and its new tokens that are kept
        lead := ir.node("ArgMax", [mask], {"axis": 1, "keepdims": 1}, name="gqa_leading_padding"),
        shifted := ir.node("Add", [position_ids, lead.outputs[0]], name="gqa_cache_positions"),
        back := ir.node("Neg", [new.outputs[0]], name="gqa_new_from_end"),  # mask[:, -new:]
        kept := ir.node("Slice", [mask, back.outputs[0], end, axis1], name="gqa_new_mask"),
        real := ir.node("Cast", [kept.outputs[0]], {"to": ir.DataType.BOOL}, name="gqa_new_kept"),
        start := ir.node("Squeeze", [past.outputs[0], axis0], name="gqa_past_scalar"),
        index := ir.node("Range", [start.outputs[0], scalar.outputs[0], step], name="gqa_new_indices"),
        positions := ir.node(
            "Where", [real.outputs[0], shifted.outputs[0], index.outputs[0]], name="gqa_positions"
        ),
    ]
    graph.insert_before(first, nodes)
    return {
        "total_1d": total.outputs[0],
        "total": scalar.outputs[0],
        "total32": scalar32.outputs[0],
        "past_1d": past.outputs[0],
        "seqlens": seqlens.outputs[0],
        "positions": positions.outputs[0],
    }


def _shape_span(node: ir.Node) -> tuple[int, int | None]:
    end = node.attributes.get("end")
    return _int_attr(node, "start"), end.as_int() if end is not None else None


def _beside_sequence(start: int, end: int | None) -> bool:
    """Whether ``Shape(start, end)`` of a cache input leaves its sequence axis (2) out: a shared buffer is
    longer there than the cache."""
    return (end is not None and 0 <= start and end <= 2) or start >= 3


def _cache_reads_ok(graph: ir.Graph, rewritten: set[int]) -> bool:
    """Whether every read of a cache input is one of the ``rewritten`` attentions or a ``Shape`` on one axis
    range that leaves the sequence axis alone or reads exactly it (a shared buffer is longer there)."""
    for value in graph.inputs:
        if not (value.name or "").startswith(CACHE_INPUT_PREFIX):
            continue
        for use in value.uses():
            node = use.node
            if id(node) in rewritten:
                continue
            if node.op_type != "Shape":
                return False
            span = _shape_span(node)
            if not _beside_sequence(*span) and span != (2, 3):  # (2, 3): read from the mask instead
                return False
    return True


def _past_lengths_from_mask(graph: ir.Graph, past: ir.Value) -> None:
    """Every ``Shape`` of a cache input on its sequence axis reads ``past`` (mask length - new tokens)."""
    import onnx_ir as ir

    for value in graph.inputs:
        if (value.name or "").startswith(CACHE_INPUT_PREFIX):
            for use in list(value.uses()):
                if use.node.op_type == "Shape" and _shape_span(use.node) == (2, 3):
                    ir.convenience.replace_all_uses_with(use.node.outputs[0], past)


def _rewrite(graph: ir.Graph, node: ir.Node, rq: ir.Node, rk: ir.Node, lengths: dict[str, ir.Value]) -> None:
    import numpy as np
    import onnx_ir as ir

    q, k, v, mask, past_k, past_v = node.inputs
    bias = mask
    if mask.dtype == ir.DataType.BOOL:  # ONNX Attention's boolean mask: keep where true
        zero = ir.val(f"{node.name}_gqa_zero", const_value=ir.tensor(np.array(0, np.float32)))
        low = ir.val(f"{node.name}_gqa_low", const_value=ir.tensor(np.array(np.finfo(np.float32).min)))
        graph.register_initializer(zero)
        graph.register_initializer(low)
        where = ir.node("Where", [mask, zero, low], name=f"{node.name}_gqa_bias")
        graph.insert_before(node, where)
        bias = where.outputs[0]
    attributes: dict[str, object] = {
        "num_heads": _int_attr(node, "q_num_heads"),
        "kv_num_heads": _int_attr(node, "kv_num_heads"),
        "do_rotary": 1,
        "causal": 0,  # the graph's mask (causal and padding) is the bias: rows it masks whole stay as they were
        "rotary_interleaved": _int_attr(rq, "interleaved"),
    }
    scale, softcap = node.attributes.get("scale"), node.attributes.get("softcap")
    if scale is not None:
        attributes["scale"] = scale.as_float()
    if softcap is not None and softcap.as_float():
        attributes["softcap"] = softcap.as_float()
    cos, sin = rq.inputs[2], rq.inputs[3]
    inputs = [rq.inputs[0], rk.inputs[0], v, past_k, past_v, lengths["seqlens"], lengths["total32"], cos, sin]
    gqa = ir.node(
        "GroupQueryAttention",
        [*inputs, lengths["positions"], bias],
        attributes,
        domain="com.microsoft",
        num_outputs=3,
        name=f"{node.name}_gqa",
    )
    ir.convenience.replace_nodes_and_values(
        graph, node, [node], [gqa], list(node.outputs[:3]), list(gqa.outputs)
    )


def attention_as_gqa(model: ir.Model) -> dict[str, int]:
    """Rewrite (in place) every cached rotary ``Attention`` the module docstring describes; all or none, since
    the lengths are shared; returns ``{GQA_RULE: count}``."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    graph = model.graph
    mask = _mask_input(graph)
    position_ids = next((v for v in graph.inputs if v.name == "position_ids"), None)
    if position_ids is None or position_ids.shape is None or position_ids.shape.rank() != 2:
        return {GQA_RULE: 0}  # (B, S) token positions only: not multimodal (3, B, S) ones
    found = [
        (node, matched)
        for node in list(graph)
        if node.op_type == "Attention"
        and node.domain in ("", "ai.onnx")
        and (matched := _match(node, graph)) is not None
    ]
    ranges = {
        id(r): r for _, (rq, _, _) in found if (r := _angles_range(rq.inputs[2], position_ids)) is not None
    }
    caches = {v.name for v in graph.inputs if (v.name or "").startswith(CACHE_INPUT_PREFIX)}
    attention = [
        n
        for n in graph
        if n.op_type == "Attention" and any(v is not None and v.name in caches for v in n.inputs)
    ]
    if mask is None or position_ids is None or not found or len(found) != len(attention) or len(ranges) != 1:
        return {GQA_RULE: 0}
    if not _cache_reads_ok(graph, {id(node) for node, _ in found}):
        return {GQA_RULE: 0}
    lengths = _step_values(graph, mask, position_ids, next(iter(graph)))
    (angles,) = ranges.values()
    angles.replace_input_with(1, lengths["total"])
    for node, (rq, rk, _) in found:
        _rewrite(graph, node, rq, rk, lengths)
    _past_lengths_from_mask(graph, lengths["past_1d"])
    ir.passes.Sequential(common_passes.RemoveUnusedNodesPass(), common_passes.TopologicalSortPass())(model)
    return {GQA_RULE: len(found)}


def shares_cache_buffer(model: onnx.ModelProto) -> bool:
    """Whether one buffer can be bound as each layer's past and present: every cache input is read by
    ``GroupQueryAttention`` or by a ``Shape`` that leaves the sequence axis alone."""
    caches = {i.name for i in model.graph.input if i.name.startswith(CACHE_INPUT_PREFIX)}
    if not caches:
        return False
    for node in model.graph.node:
        if not caches.intersection(node.input) or (node.domain, node.op_type) == _GQA:
            continue
        if node.op_type != "Shape":
            return False
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        end = next((a.i for a in node.attribute if a.name == "end"), None)
        if not _beside_sequence(start, end):
            return False
    return any((n.domain, n.op_type) == _GQA for n in model.graph.node)
