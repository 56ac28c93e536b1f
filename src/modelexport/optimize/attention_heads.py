"""Hand ``Attention`` (opset 23) its query, key and value as the projections wrote them: (B, S, heads * D).

After :mod:`.masked_attention` every layer of a decoder still splits each projection into heads itself
(``Reshape`` to (B, S, heads, D), ``Transpose`` to (B, heads, S, D), the rotary embedding on that) and
merges the attention's output back (``Transpose``, ``Reshape``): the model's own ``view`` /
``transpose`` calls, eight nodes a layer. ONNX's ``Attention`` defines the same computation on 3-D
inputs given ``q_num_heads`` and ``kv_num_heads`` (head ``h`` is columns ``h * D .. (h + 1) * D`` of the
last axis, the order the ``Reshape`` splits), and writes a 3-D output in the order the merge writes;
ONNX Runtime's ``RotaryEmbedding`` (com.microsoft) takes the same 3-D layout given ``num_heads``. The
past and present stay 4-D. Exact: the same numbers in the same order (issue 26: 98 fewer nodes on a
12-layer decoder, about 3% of a one-token step on one thread).

Matched by what the nodes compute, on inferred shapes, not by names: a ``Reshape`` whose output keeps
the input's first two dimensions and splits its static last one into (heads, D), then ``Transpose``
``[0, 2, 1, 3]``, each read by the next node only (a rotary embedding may sit between); on the output,
``Transpose`` ``[0, 2, 1, 3]`` (after a ``Reshape`` that keeps the shape, if any) and a ``Reshape`` to
(B, S, heads * D), which goes, or to (B * S, heads * D), which then reads the 3-D output (the same element
order). A layer where any of the four edges looks different (a normalization on the heads, an unknown
size) is left as it is. :func:`.fusion.fuse_for_ort` checks
the rewritten graph against its input on padded batches, as it does every fusion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["HEADS_RULE", "attention_on_projections"]

#: The counter name reported by ``fusion.fuse_for_ort``.
HEADS_RULE = "attention_3d"
_HEAD_SPLIT = (0, 2, 1, 3)
#: Rotary embeddings that take (B, S, heads * D) given ``num_heads``, between the split and the attention.
_ROTARY = ("com.microsoft", "RotaryEmbedding")


def _only_reader(value: ir.Value, node: ir.Node) -> bool:
    return len(value.uses()) == 1 and value.uses()[0].node is node and not value.is_graph_output()


def _static(dim: int | ir.SymbolicDim) -> int | None:
    return dim if isinstance(dim, int) else None


def _same_dim(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    return a == b if isinstance(a, int) or isinstance(b, int) else a.value is not None and a.value == b.value


def _perm(node: ir.Node) -> tuple[int, ...]:
    attr = node.attributes.get("perm")
    return tuple(attr.as_ints()) if attr is not None else ()


def _split_heads(value: ir.Value, reader: ir.Node) -> tuple[ir.Value, int] | None:
    """``value`` = Transpose(Reshape(x)) splitting x's (B, S, heads * D) into (B, heads, S, D), read by
    ``reader`` only: (x, heads). The two nodes are left unused by the rewrite and removed with the rest."""
    transpose = value.producer()
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
        return None
    if _perm(transpose) != _HEAD_SPLIT or not _only_reader(value, reader):
        return None
    split = transpose.inputs[0]
    reshape = split.producer() if split is not None else None
    if reshape is None or reshape.op_type != "Reshape" or not _only_reader(split, transpose):
        return None
    x = reshape.inputs[0]
    if x is None or x.shape is None or split.shape is None or x.shape.rank() != 3 or split.shape.rank() != 4:
        return None
    width, head = _static(x.shape[2]), _static(split.shape[3])
    if not width or not head or width % head:
        return None
    if not (_same_dim(x.shape[0], split.shape[0]) and _same_dim(x.shape[1], split.shape[1])):
        return None
    return x, width // head


def _same_shape(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.rank() == b.rank()
        and all(_same_dim(x, y) for x, y in zip(a.dims, b.dims, strict=True))
    )


def _merge_heads(value: ir.Value) -> tuple[ir.Node, bool] | None:
    """``value`` (B, heads, S, D) read only by Transpose ``[0, 2, 1, 3]`` (after a ``Reshape`` that keeps its
    shape, if any) then by a ``Reshape`` to (B, S, heads * D) or (B * S, heads * D): (that last Reshape,
    whether it is the identity on the 3-D output)."""
    if value.is_graph_output() or value.shape is None or value.shape.rank() != 4:
        return None
    heads, head = _static(value.shape[1]), _static(value.shape[3])
    uses = value.uses()
    if len(uses) == 1 and uses[0].node.op_type == "Reshape" and uses[0].idx == 0:
        same = uses[0].node  # a view that keeps the shape (``contiguous()``)
        if _same_shape(same.outputs[0].shape, value.shape) and not same.outputs[0].is_graph_output():
            uses = same.outputs[0].uses()
    if len(uses) != 1 or uses[0].node.op_type != "Transpose" or _perm(uses[0].node) != _HEAD_SPLIT:
        return None
    transpose = uses[0].node
    merged = transpose.outputs[0]
    reads = merged.uses()
    if len(reads) != 1 or merged.is_graph_output() or reads[0].node.op_type != "Reshape" or reads[0].idx != 0:
        return None
    reshape = reads[0].node
    out = reshape.outputs[0].shape
    if out is None or out.rank() not in (2, 3) or not heads or not head or _static(out[-1]) != heads * head:
        return None
    identity = out.rank() == 3 and _same_dim(out[0], value.shape[0]) and _same_dim(out[1], value.shape[2])
    return reshape, identity


def _rewrite(node: ir.Node) -> bool:
    """One ``Attention`` on 3-D projections, if all its edges match; ``node`` is changed in place."""
    import onnx_ir as ir

    inputs: list[tuple[int, ir.Value, int, ir.Node | None]] = []
    for index in range(3):
        value, rotary = node.inputs[index], None
        producer = value.producer() if value is not None else None
        if producer is not None and (producer.domain, producer.op_type) == _ROTARY:
            if not _only_reader(value, node):
                return False
            rotary, value = producer, producer.inputs[0]
        found = _split_heads(value, rotary or node) if value is not None else None
        if found is None:
            return False
        inputs.append((index, found[0], found[1], rotary))
    merged = _merge_heads(node.outputs[0])
    if merged is None:
        return False
    for index, projection, heads, rotary in inputs:
        if rotary is None:
            node.replace_input_with(index, projection)
        else:
            rotary.replace_input_with(0, projection)
            rotary.attributes["num_heads"] = ir.AttrInt64("num_heads", heads)
    node.attributes["q_num_heads"] = ir.AttrInt64("q_num_heads", inputs[0][2])
    node.attributes["kv_num_heads"] = ir.AttrInt64("kv_num_heads", inputs[1][2])
    reshape, identity = merged
    attended = node.outputs[0]
    if identity:
        attended.shape = reshape.outputs[0].shape
        ir.convenience.replace_all_uses_with(reshape.outputs[0], attended)
    else:  # (B, S, heads * D) flattened to (B * S, heads * D): the same element order as from 4-D
        attended.shape = None
        reshape.replace_input_with(0, attended)
    return True


def attention_on_projections(model: ir.Model) -> dict[str, int]:
    """Rewrite (in place) every ``Attention`` whose query, key and value are split into heads and whose output
    is merged back by ``Reshape`` / ``Transpose`` pairs; returns ``{HEADS_RULE: count}``."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    common_passes.ShapeInferencePass()(model)  # the match reads ranks and static sizes
    count = sum(
        _rewrite(node)
        for node in list(model.graph)
        if node.op_type == "Attention"
        and node.domain in ("", "ai.onnx")
        and "q_num_heads" not in node.attributes
    )
    if count:
        ir.passes.Sequential(common_passes.RemoveUnusedNodesPass(), common_passes.TopologicalSortPass())(
            model
        )
    return {HEADS_RULE: count}
