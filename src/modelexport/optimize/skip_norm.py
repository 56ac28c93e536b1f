"""Split the fused skip normalizations back into ``Add`` + the normalization for the CPU provider.

onnxscript's rewriter (and ORT's transformer optimizer) fuse the residual ``Add`` into the following
``LayerNormalization`` (``SkipLayerNormalization``) or RMS normalization (``SkipSimplifiedLayerNormalization``).
ONNX Runtime's CPU kernels for the fused ops run slower than the ops they replace: 4-8x for
``SkipLayerNormalization`` on one thread, 1.3-2x for the RMS form on more than one token, equal on one
token (``benchmarks/kernel_choice.py``). A graph deployed on CPU is faster with the unfused ops, and
``runtime.session`` keeps ORT from fusing them again when a session runs on the CPU alone. GPU kernels
are the other way round: ``-O4`` (float16 for GPU) keeps the fusion (``OptimizeConfig.skip_norm_fusion``).

A graph that takes a key/value cache (``past_key_values.*`` inputs) keeps the RMS form fused
(:data:`KEPT_FOR_DECODING`): it runs mostly one-token steps, where that kernel is as fast as the two ops it
replaces on one thread and faster on two, one node instead of two per residual (issue 26: a 12-layer int4
decoder, 24 fewer nodes, per token 3.86-3.99 -> 3.53-3.75 ms at 2 threads, 5.73-5.83 -> 5.69-5.73 ms at 1;
its 128-token prefill no slower, 212 -> 208 ms).

Exact: the split computes what the fused op defines (input + skip [+ bias], then the normalization over
the last axis with the node's epsilon). The optional mean / inverse-std outputs are not produced by the
split; a node whose graph reads them is left fused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..metadata.schema import CACHE_INPUT_PREFIX

if TYPE_CHECKING:
    import onnx

__all__ = ["KEPT_FOR_DECODING", "SPLIT_OPS", "SkipNormSplit", "kept_for", "split_skip_layer_norms"]

_DOMAIN = "com.microsoft"
#: fused op -> (normalization it splits into, its domain, whether input 3 is beta (else bias))
SPLIT_OPS: dict[str, tuple[str, str, bool]] = {
    "SkipLayerNormalization": ("LayerNormalization", "", True),
    # ORT's RMS normalization, in the default domain as its RMSNorm fusion writes it
    "SkipSimplifiedLayerNormalization": ("SimplifiedLayerNormalization", "", False),
}


#: The fused ops a graph with a key/value cache keeps (its steps are mostly one token).
KEPT_FOR_DECODING = frozenset({"SkipSimplifiedLayerNormalization"})


def kept_for(model: onnx.ModelProto) -> frozenset[str]:
    """The fused ops :func:`split_skip_layer_norms` leaves in ``model``: :data:`KEPT_FOR_DECODING` when the graph
    takes a key/value cache, none otherwise."""
    takes_cache = any(i.name.startswith(CACHE_INPUT_PREFIX) for i in model.graph.input)
    return KEPT_FOR_DECODING if takes_cache else frozenset()


@dataclass(frozen=True)
class SkipNormSplit:
    """The graph with fused skip normalizations split, how many were split and how many kept (why:
    their mean / inverse-std outputs are read)."""

    model: onnx.ModelProto
    split: int
    kept: int = 0


def _attr(node: onnx.NodeProto, name: str, default: float) -> float:
    return next((a.f for a in node.attribute if a.name == name), default)


def _is_fused(node: onnx.NodeProto) -> bool:
    return node.op_type in SPLIT_OPS and node.domain == _DOMAIN


def _split(node: onnx.NodeProto, index: int) -> list[onnx.NodeProto]:
    """``Add`` (input + skip), ``Add`` (+ bias) when there is one, then the normalization; the fused node's
    output names are kept, so consumers are unchanged."""
    from onnx import helper

    norm, domain, has_beta = SPLIT_OPS[node.op_type]
    inputs = (list(node.input) + [""] * 5)[:5]
    x, skip, gamma = inputs[:3]
    beta, bias = (inputs[3], inputs[4]) if has_beta else ("", inputs[3])
    outputs = list(node.output) + [""] * (4 - len(node.output))
    name = node.name or f"{node.op_type}_{index}"
    total = outputs[3] or f"{name}/sum"
    nodes = []
    if bias:
        nodes.append(helper.make_node("Add", [x, skip], [f"{name}/skip"], name=f"{name}/add"))
        nodes.append(helper.make_node("Add", [f"{name}/skip", bias], [total], name=f"{name}/bias"))
    else:
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{name}/add"))
    nodes.append(
        helper.make_node(
            norm,
            [total, gamma, *([beta] if beta else [])],
            [outputs[0]],
            name=f"{name}/norm",
            domain=domain,
            axis=-1,
            epsilon=_attr(node, "epsilon", 1e-12),
        )
    )
    return nodes


def split_skip_layer_norms(model: onnx.ModelProto, keep: frozenset[str] = frozenset()) -> SkipNormSplit:
    """``model`` (untouched) with each fused skip normalization replaced by ``Add`` nodes and the plain
    normalization (opset >= 17 for ``LayerNormalization``); the graph's tensor names are kept. Fused ops named
    in ``keep`` stay (:func:`kept_for`), counted as kept."""
    import onnx

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    fused = [n for n in model.graph.node if _is_fused(n)]
    if not fused or opset < 17:
        return SkipNormSplit(model, 0, len(fused))
    read = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    split = kept = 0
    for node in out.graph.node:
        statistics = set(list(node.output)[1:3]) - {""}
        if not _is_fused(node) or statistics & read or node.op_type in keep:
            kept += _is_fused(node)
            nodes.append(node)
            continue
        nodes.extend(_split(node, split))
        split += 1
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return SkipNormSplit(out, split, kept)
