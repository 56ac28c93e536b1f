"""Give fused ``Attention`` nodes the padding mask as ORT's ``mask_index`` instead of a 4-D additive bias.

The dynamo export turns the 2-D ``attention_mask`` into a float bias of shape (batch, 1, seq, seq) on
every run (Unsqueeze, Expand, Cast, Sub, Where, ...), and onnxscript's fusion feeds that bias to each
``Attention`` (input 5, ``attention_bias``). ONNX Runtime's ``Attention`` also takes the raw mask itself
(input 3, ``mask_index`` of shape (batch, total_seq), int32) and adds ``mask_filter_value`` where it is 0:
the same scores for any padding (left, right or holes), without building and reading the 4-D tensor.

No pattern is matched by name or op sequence: the bias's producer subgraph is run on masks with right,
left and scattered padding, and the rewrite happens only when the bias is exactly "0 where the key is
kept, one constant where it is masked", the same for every query row and head. The caller still checks
the whole rewritten graph against its input (``fusion.fuse_for_ort``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hierarchy.graph import drop_dead_nodes, tensor_edges
from ..runtime.session import create_session

if TYPE_CHECKING:
    import onnx

__all__ = ["use_mask_index", "key_padding_value"]

_ATTENTION = ("com.microsoft", "Attention")
_MASK_INDEX, _ATTENTION_BIAS = 3, 5
#: Probe masks: (batch 3, seq 7) with right padding, left padding and holes; row 0 is never padded.
_PROBE_MASKS = (
    ((1, 1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 0, 0, 0), (1, 1, 1, 1, 1, 1, 0)),
    ((1, 1, 1, 1, 1, 1, 1), (0, 0, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 1, 1)),
    ((1, 0, 1, 1, 0, 1, 1), (1, 1, 0, 1, 0, 0, 1), (0, 1, 1, 1, 1, 1, 0)),
)


def _upstream(model: onnx.ModelProto, tensor: str) -> tuple[list[Any], set[str]]:
    """The nodes computing ``tensor`` (graph order) and the graph inputs they read."""
    nodes = model.graph.node
    edges = tensor_edges(nodes)
    inputs = {i.name for i in model.graph.input}
    keep, reads, stack = set(), set(), [tensor]
    while stack:
        name = stack.pop()
        if name in inputs:
            reads.add(name)
        idx = edges.producer.get(name)
        if idx is None or idx in keep:
            continue
        keep.add(idx)
        stack.extend(i for i in nodes[idx].input if i)
    return [nodes[i] for i in sorted(keep)], reads


def _subgraph(model: onnx.ModelProto, nodes: list[Any], reads: set[str], output: str) -> onnx.ModelProto:
    from onnx import helper

    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes,
        "bias",
        [i for i in model.graph.input if i.name in reads],
        [helper.make_empty_tensor_value_info(output)],
        [t for t in model.graph.initializer if t.name in used],
    )
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def key_padding_value(model: onnx.ModelProto, bias: str) -> tuple[str, float] | None:
    """(mask input, masked value) when ``bias`` is a key-padding bias of one 2-D integer graph input:
    0 where the mask is 1, the same constant where it is 0, for every head and query row; else None."""
    import numpy as np
    from onnx import helper

    nodes, reads = _upstream(model, bias)
    typed = {i.name: i.type.tensor_type for i in model.graph.input if i.name in reads}
    masks = [
        n
        for n, t in typed.items()
        if len(t.shape.dim) == 2 and np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).kind in "iub"
    ]
    masks = [n for n in masks if "mask" in n.lower()] or masks
    if len(masks) != 1 or any(len(t.shape.dim) != 2 for t in typed.values()):
        return None
    try:
        session = create_session(_subgraph(model, nodes, reads, bias), log_severity_level=4)[0]
        values = []
        for rows in _PROBE_MASKS:
            mask = np.array(rows)
            feeds = {
                n: (mask if n == masks[0] else np.zeros_like(mask)).astype(
                    helper.tensor_dtype_to_np_dtype(t.elem_type)
                )
                for n, t in typed.items()
            }
            raw = session.run(None, feeds)[0]
            if raw.ndim != 4:
                return None
            out = np.broadcast_to(raw, (len(mask), 1, mask.shape[1], mask.shape[1]))
            kept = np.broadcast_to(mask[:, None, None, :] > 0, out.shape)
            if np.any(out[kept] != 0) or len(set(out[~kept].tolist())) != 1:
                return None
            values.append(float(out[~kept][0]))
    except Exception:  # noqa: BLE001 - a bias this probe cannot run or broadcast is left as it is
        return None
    return (masks[0], values[0]) if len(set(values)) == 1 and values[0] < -1e4 else None


def use_mask_index(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose ``Attention`` nodes read the raw mask (``mask_index``) where their
    ``attention_bias`` is a key-padding bias; returns it and how many nodes were rewritten."""
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    attention = [
        n
        for n in out.graph.node
        if (n.domain, n.op_type) == _ATTENTION
        and len(n.input) > _ATTENTION_BIAS
        and n.input[_ATTENTION_BIAS]
        and not n.input[_MASK_INDEX]
    ]
    producers = {o: n for n in out.graph.node for o in n.output}
    casts: dict[str, str] = {}
    rewritten = 0
    for bias in dict.fromkeys(n.input[_ATTENTION_BIAS] for n in attention):
        found = key_padding_value(out, bias)
        if found is None:
            continue
        mask, value = found
        if mask not in casts:
            casts[mask] = f"{mask}_mask_index"
            name = f"{producers[bias].name}_mask_index" if bias in producers else f"{mask}_mask_index"
            out.graph.node.insert(
                0, helper.make_node("Cast", [mask], [casts[mask]], name=name, to=onnx.TensorProto.INT32)
            )
        for node in (n for n in attention if n.input[_ATTENTION_BIAS] == bias):
            node.input[_MASK_INDEX], node.input[_ATTENTION_BIAS] = casts[mask], ""
            while node.input and not node.input[-1]:
                node.input.pop()
            kept = [a for a in node.attribute if a.name != "mask_filter_value"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("mask_filter_value", value)])
            rewritten += 1
    if rewritten:
        drop_dead_nodes(out)
    return out, rewritten
