"""Join the MatMuls that read one input into one MatMul and a ``Split``: an attention's q/k/v projections, an
MLP's gate/up projections.

A decoding step of a small LLM runs every weight product on one row, so its time is the kernels' per-call
cost as much as the weights they read: three ``MatMulNBits`` on the same activations quantize that row three
times and launch three kernels where one serves (onnxruntime-genai's builder writes q/k/v as one ``qkv_proj``
for the same reason). Weights are concatenated along the output axis, so a block-wise quantizer (blocks run
along the input axis, one scale per block and column) gives every column exactly the weights it gave it
before. The new nodes are tagged with the deepest module the joined ones share (the attention, the MLP).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..hierarchy.passes import PassResult
from ..hierarchy.tags import common_ancestor, node_tag, set_node_tag

if TYPE_CHECKING:
    import onnx

__all__ = ["PACKED_READERS", "FuseProjections", "sibling_groups"]

_INHERITED = "inherited"
#: Ops that take their first ``n`` inputs packed side by side in the first one (the others then empty):
#: ONNX Runtime's GroupQueryAttention reads query, key and value from one (B, S, q + k + v) tensor.
PACKED_READERS: dict[tuple[str, str], int] = {("com.microsoft", "GroupQueryAttention"): 3}


def _tag(node: onnx.NodeProto) -> str | None:
    return node_tag(node)


def sibling_groups(model: onnx.ModelProto, names: Iterable[str]) -> list[list[int]]:
    """Indexes of the nodes among ``names`` (MatMuls with a 2-D in-file weight) that share their first input,
    in graph order, groups of two or more whose weights have one row count and one type."""
    from onnx import TensorProto

    wanted = set(names)
    inits = {t.name: t for t in model.graph.initializer}
    by_input: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for k, node in enumerate(model.graph.node):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and node.name in wanted else None
        if weight is None or len(weight.dims) != 2 or weight.data_location == TensorProto.EXTERNAL:
            continue
        by_input[(node.input[0], int(weight.dims[0]), weight.data_type)].append(k)
    return [group for group in by_input.values() if len(group) > 1]


@dataclass(frozen=True)
class FuseProjections:
    """MatMuls among ``names`` that read the same tensor -> one MatMul (weights side by side) + ``Split``.

    The joined MatMul keeps the first node's name with ``_joined`` (quantizers name their nodes after it),
    the ``Split`` writes the old outputs, so every consumer is untouched; a reader that takes them packed
    (``PACKED_READERS``: GroupQueryAttention's query, key, value) reads the joined output instead, its columns
    in the order it lists them, and there is no ``Split``. The input model is not changed.
    """

    names: frozenset[str]
    name = "fuse_projections"
    in_place = False

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper

        groups = sibling_groups(model, self.names)
        if not groups:
            return PassResult(model, False, {"joined": 0, "joined_nodes": []})
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        inits = {t.name: t for t in copy.graph.initializer}
        replace: dict[int, list[Any]] = {}
        joined: list[str] = []
        readers = _readers(copy.graph)
        for group in groups:
            packed = _packed_reader([copy.graph.node[k] for k in group], readers)
            if packed is not None:  # the joined columns in the order the reader lists them
                group = sorted(group, key=lambda k: list(packed.input).index(copy.graph.node[k].output[0]))
            nodes = [copy.graph.node[k] for k in group]
            weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
            base = f"{nodes[0].name}_joined"
            weight = numpy_helper.from_array(np.concatenate(weights, axis=1), f"{base}.weight")
            sizes = numpy_helper.from_array(
                np.array([w.shape[1] for w in weights], np.int64), f"{base}.sizes"
            )
            copy.graph.initializer.extend([weight, sizes])
            product = helper.make_node("MatMul", [nodes[0].input[0], weight.name], [f"{base}_out"], name=base)
            written = [product]
            if packed is None:
                outputs = [n.output[0] for n in nodes]
                split = helper.make_node(
                    "Split", [product.output[0], sizes.name], outputs, name=f"{base}_split", axis=-1
                )
                written.append(split)
            else:
                packed.input[: len(nodes)] = [product.output[0], *[""] * (len(nodes) - 1)]
            tag = common_ancestor({t for n in nodes if (t := _tag(n))})
            for new in written:
                if tag:
                    set_node_tag(new, tag, _INHERITED)
            replace[min(group)] = written
            replace.update({k: [] for k in group if k != min(group)})
            joined.append(", ".join(n.name for n in nodes))
        kept = [new for k, node in enumerate(copy.graph.node) for new in replace.get(k, [node])]
        del copy.graph.node[:]
        copy.graph.node.extend(kept)
        _drop_unused_initializers(copy)
        return PassResult(copy, True, {"joined": len(groups), "joined_nodes": joined})


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    return readers


def _packed_reader(
    nodes: list[onnx.NodeProto], readers: dict[str, list[onnx.NodeProto]]
) -> onnx.NodeProto | None:
    """The one node that reads the outputs of ``nodes``, and nothing else reads, as the inputs it also takes
    packed side by side in its first input (``PACKED_READERS``), else None."""
    outputs = [n.output[0] for n in nodes]
    found = {id(r): r for name in outputs for r in readers.get(name, [])}
    if len(found) != 1 or any(len(readers.get(name, [])) != 1 for name in outputs):
        return None
    (reader,) = found.values()
    count = PACKED_READERS.get((reader.domain, reader.op_type))
    if count is None or count != len(outputs) or sorted(reader.input[:count]) != sorted(outputs):
        return None
    return reader


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Tensor names read by ``graph``'s nodes, its subgraphs' nodes included, and its outputs."""
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                used |= _used_names(sub)
    return used


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = _used_names(model.graph)
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
