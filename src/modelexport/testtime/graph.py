"""Small ONNX graph passes used by test-time compute. Each returns a new model; inputs are never modified.

Loading accepts an exported folder (``model.onnx`` inside), a ``.onnx`` path, bytes or a ModelProto.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..onnxfile import load_onnx

#: What :func:`load_model` reads: an exported folder or ``.onnx`` path, serialized bytes, or a ``ModelProto``.
ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto

__all__ = [
    "ModelLike",
    "load_model",
    "expose_initializers",
    "add_outputs",
    "write_initializers",
    "initializer_arrays",
    "constant_value",
    "has_upstream",
    "mix_batch_statistics",
    "mix_variance_gate",
    "mix_weight",
    "mixed_statistics",
    "node_label",
    "tail_model",
    "SAMPLE_STATS",
]


def load_model(model: ModelLike) -> onnx.ModelProto:
    """A private copy of the model (callers may rewrite it freely); paths load through :func:`load_onnx`."""
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    return load_onnx(model)


def initializer_arrays(model: onnx.ModelProto, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Initializers as numpy arrays (all, or the named ones)."""
    wanted = set(names) if names is not None else None
    return {
        t.name: numpy_helper.to_array(t)
        for t in model.graph.initializer
        if wanted is None or t.name in wanted
    }


def expose_initializers(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Make initializers overridable graph inputs (their stored value stays the default).

    ONNX Runtime then takes per-run values for them, so one shared session serves any adapted state
    without being modified, and it cannot constant-fold them away.
    """
    out = load_model(model)
    present = {i.name for i in out.graph.input}
    for t in out.graph.initializer:
        if t.name in names and t.name not in present:
            out.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _elem_type(model: onnx.ModelProto, name: str) -> int:
    for vi in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        if t.name == name:
            return t.data_type
    return onnx.TensorProto.FLOAT


def add_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Expose intermediate tensors as extra graph outputs."""
    out = load_model(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - types then default to float
        inferred = out
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(helper.make_tensor_value_info(name, _elem_type(inferred, name), None))
    return out


def write_initializers(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with the named initializers replaced (same dtype and shape)."""
    out = load_model(model)
    for i, t in enumerate(out.graph.initializer):
        if t.name in values:
            old = numpy_helper.to_array(t)
            new = np.asarray(values[t.name], dtype=old.dtype).reshape(old.shape)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array(new, t.name))
    return out


def constant_value(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of a tensor produced by a Constant node or stored as an initializer (None otherwise)."""
    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    return np.asarray(helper.get_attribute_value(attr))
    return None


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or ``<op>_<index>`` for an unnamed one (the index in ``graph.node``)."""
    return node.name or f"{node.op_type.lower()}_{index}"


def has_upstream(model: onnx.ModelProto, tensor: str, op_type: str) -> bool:
    """Whether ``tensor`` is computed from the output of an ``op_type`` node (anywhere upstream)."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    seen: set[str] = set()
    todo = [tensor]
    while todo:
        name = todo.pop()
        node = producers.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        if node.op_type == op_type:
            return True
        todo.extend(i for i in node.input if i)
    return False


#: Integer tensor types: shape arithmetic (Shape, Gather, Concat of sizes) that a tail recomputes itself.
_INTEGER_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


def tail_model(model: onnx.ModelProto, start: int, output: str) -> tuple[onnx.ModelProto, list[str]]:
    """The tail of ``model`` from node ``start`` (its index in ``graph.node``, a topological order): the nodes
    from there on that ``output`` needs, and the tensors it must be fed -- those they read that an earlier node
    computes or the graph is given (initializers and Constant nodes come along). Shape arithmetic is
    recomputed, not fed (an earlier node's integer output comes along with the nodes it needs), so the tail
    runs on a batch of any size. Fed the tensors of a full pass, it computes ``output`` as the graph does."""
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - types then default to float: shape tensors are fed
        typed = model
    producer = {o: i for i, n in enumerate(model.graph.node) for o in n.output if o}
    inits = {t.name for t in model.graph.initializer}
    needed: set[int] = set()
    fed: list[str] = []
    todo, seen = [output], set()
    while todo:
        name = todo.pop()
        if name in seen or name in inits:
            continue
        seen.add(name)
        i = producer.get(name)
        if i is None or (i < start and _elem_type(typed, name) not in _INTEGER_TYPES):
            fed.append(name)
            continue
        needed.add(i)
        todo.extend(x for x in model.graph.node[i].input if x)
    nodes = [n for i, n in enumerate(model.graph.node) if i in needed]
    used = {x for n in nodes for x in n.input}
    graph = helper.make_graph(
        nodes,
        "tail",
        [helper.make_tensor_value_info(name, _elem_type(typed, name), None) for name in fed],
        [helper.make_tensor_value_info(output, _elem_type(typed, output), None)],
        [t for t in model.graph.initializer if t.name in used],
    )
    return helper.make_model(graph, opset_imports=list(model.opset_import)), sorted(fed)


def _ranks_and_types(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[int | None, int]]:
    """Per tensor: its rank and element type, as shape inference gives them (None / UNDEFINED where it cannot)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - ranks then stay unknown and the general path is used
        inferred = model
    infos = {
        vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    out: dict[str, tuple[int | None, int]] = {}
    for name in names:
        vi = infos.get(name)
        if vi is None:
            out[name] = (None, onnx.TensorProto.UNDEFINED)
            continue
        tensor = vi.type.tensor_type
        out[name] = (len(tensor.shape.dim) if tensor.HasField("shape") else None, tensor.elem_type)
    return out


class _Nodes:
    """Nodes and constants added by :func:`mix_batch_statistics`, named under one prefix."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def add(self, op: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def mean(self, x: str, axes: list[int], output: str, keepdims: bool = False) -> str:
        """ReduceMean (axes an input from opset 18, an attribute before)."""
        if self.opset >= 18:
            return self.add(
                "ReduceMean",
                [x, self.const(f"{output}.axes", np.asarray(axes, np.int64))],
                output,
                keepdims=int(keepdims),
            )
        return self.add("ReduceMean", [x], output, axes=axes, keepdims=int(keepdims))


#: Channels of ONNX Runtime's blocked (NCHWc) layout on AVX-512 (8 on AVX2, a divisor): a BatchNormalization
#: input with a multiple of them stays blocked after the convolution that computes it (:func:`_per_example`).
NCHWC_BLOCK = 16
#: Prefix of every tensor :func:`mix_batch_statistics` adds.
MIX_PREFIX = "modelexport.tta."
#: Output (N, 2S, ...): every example's per-channel mean at each BatchNormalization input (S channels in all,
#: in graph order), then its per-channel mean square (trailing axes of size 1 when the inputs are images).
SAMPLE_STATS = MIX_PREFIX + "sample_stats"


def mix_weight(index: int) -> str:
    """The scalar input: the weight of the batch's own statistics at mixed BN layer ``index`` (default 0)."""
    return f"{MIX_PREFIX}{index}.weight"


def mix_variance_gate(index: int) -> str:
    """The scalar input: the share of :func:`mix_weight` the variance of mixed BN layer ``index`` takes
    (default 1; 0: the layer's variance stays the given one while its mean mixes in the batch's)."""
    return f"{MIX_PREFIX}{index}.variance_gate"


def mixed_statistics(index: int) -> tuple[str, str]:
    """The outputs: the mean and variance mixed BN layer ``index`` normalised with."""
    return f"{MIX_PREFIX}{index}.mean", f"{MIX_PREFIX}{index}.var"


def _per_example(g: _Nodes, x: str, rank: int | None, p: str, pooled: bool, blocked: bool) -> tuple[str, str]:
    """Per-example channel means and mean squares of ``x`` (N, C, ...): (N, C), or with ``pooled`` (every BN
    input of one rank >= 3) (N, C, 1, ...) as they are -- fewer nodes at batch size 1.

    ``blocked`` (the square a Mul, the means GlobalAveragePool, which every type has): where ``x`` fills ONNX
    Runtime's blocked (NCHWc) layout, in which it keeps the convolution's output, they run there. A float32
    ``x`` whose channels do not fill it (``blocked`` False) squares with Pow and averages with ReduceMean: ONNX
    Runtime computes a Mul of two blocked tensors blocked (on channels padded to the block) and reorders it
    back, and its plain GlobalAveragePool is slower than ReduceMean. On the 8-channel stem of the small
    benchmark CNN (32 x 32 images) the adapted pass went from 1.55x to 1.38x a plain one."""
    if rank == 2:
        return x, g.add("Mul", [x, x], f"{p}.square")
    if rank is not None and rank >= 3:
        if blocked:
            square = g.add("Mul", [x, x], f"{p}.square")
            means = [g.add("GlobalAveragePool", [t], f"{p}.{k}.pooled") for k, t in (("m", x), ("q", square))]
        else:
            two = g.const(f"{p}.two", np.asarray(2.0, np.float32))
            square = g.add("Pow", [x, two], f"{p}.square")
            spatial = list(range(2, rank))
            if not pooled:
                return g.mean(x, spatial, f"{p}.m"), g.mean(square, spatial, f"{p}.q")
            means = [
                g.mean(t, spatial, f"{p}.{k}.pooled", keepdims=True) for k, t in (("m", x), ("q", square))
            ]
        if pooled:
            return means[0], means[1]
        return g.add("Flatten", [means[0]], f"{p}.m", axis=1), g.add("Flatten", [means[1]], f"{p}.q", axis=1)
    square = g.add("Mul", [x, x], f"{p}.square")
    shape = g.const(f"{p}.shape", np.asarray([0, 0, -1], np.int64))
    flat = [g.add("Reshape", [t, shape], f"{p}.{k}.flat") for k, t in (("m", x), ("q", square))]
    return g.mean(flat[0], [2], f"{p}.m"), g.mean(flat[1], [2], f"{p}.q")


def _mixed(g: _Nodes, m: str, q: str, axes: list[int], mean: str, var: str, index: int) -> tuple[str, str]:
    """The mixture of the prior (``mean``, ``var``) with weight 1 - w and the batch's statistics with weight w,
    the variance with weight v = w * gate (:func:`mix_variance_gate`, default 1)::

    mean' = mean + w d,  var' = var + v (batch_var - var) + v (1 - v) d^2,  d = batch_mean - mean

    exact at w = 0 (the prior) and w = 1 (train-mode BatchNorm on the batch)."""
    p, w = f"{MIX_PREFIX}{index}", mix_weight(index)
    bm, bq = g.mean(m, axes, f"{p}.batch_mean"), g.mean(q, axes, f"{p}.batch_square")
    bv = g.add("Relu", [g.add("Sub", [bq, g.add("Mul", [bm, bm], f"{p}.bm2")], f"{p}.bv0")], f"{p}.batch_var")
    d = g.add("Sub", [bm, mean], f"{p}.d")
    wd = g.add("Mul", [w, d], f"{p}.wd")
    out_mean, out_var = mixed_statistics(index)
    g.add("Add", [mean, wd], out_mean)
    v = g.add("Mul", [w, mix_variance_gate(index)], f"{p}.v")
    vd = g.add("Mul", [v, d], f"{p}.vd")
    spread = g.add("Add", [var, g.add("Mul", [v, g.add("Sub", [bv, var], f"{p}.dv")], f"{p}.wdv")], f"{p}.v0")
    cross = g.add("Mul", [vd, g.add("Sub", [d, vd], f"{p}.d1")], f"{p}.cross")
    g.add("Add", [spread, cross], out_var)
    return out_mean, out_var


def mix_batch_statistics(model: onnx.ModelProto, bn_nodes: list[str], mixed: set[int]) -> onnx.ModelProto:
    """A copy whose BatchNormalization nodes (``bn_nodes``, by :func:`node_label`, in graph order) report every
    example's channel statistics (:data:`SAMPLE_STATS`), and whose ``mixed`` ones (indices into ``bn_nodes``)
    normalise with their mean/var inputs mixed with the batch's own statistics by the scalar input
    :func:`mix_weight` (default 0: the graph computes what it did). One pass computes what exact test-batch
    statistics would otherwise need one pass per layer for: each layer sees its input as normalised above."""
    out = load_model(model)
    g = _Nodes(next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1))
    wanted = {name: i for i, name in enumerate(bn_nodes)}
    found = {node_label(n, k): n for k, n in enumerate(out.graph.node) if n.op_type == "BatchNormalization"}
    missing = sorted(set(bn_nodes) - set(found))
    if missing:
        raise ValueError(f"no BatchNormalization nodes named {missing}")
    types = _ranks_and_types(out, [found[name].input[0] for name in bn_nodes])
    ranks = {name: rank for name, (rank, _) in types.items()}
    kinds = set(ranks.values())
    pooled = len(kinds) == 1 and (kinds.pop() or 0) >= 3  # (N, C, 1, ...) parts concatenate as they are
    axes = [0, *range(2, next(iter(ranks.values())) or 2)] if pooled else [0]
    parts: list[tuple[str, str]] = []
    nodes: list[onnx.NodeProto] = []
    for k, node in enumerate(out.graph.node):
        i = wanted.get(node_label(node, k)) if node.op_type == "BatchNormalization" else None
        if i is None:
            nodes.append(node)
            continue
        x = node.input[0]
        channels = next((t.dims[0] for t in out.graph.initializer if t.name == node.input[1]), None)
        # the blocked layout is float32's: another type, or unknown channels, keeps Mul and GlobalAveragePool
        plain = types[x][1] == onnx.TensorProto.FLOAT and channels is not None and channels % NCHWC_BLOCK != 0
        m, q = _per_example(g, x, ranks[x], f"{MIX_PREFIX}{i}", pooled, not plain)
        parts.append((m, q))
        bn = onnx.NodeProto()
        bn.CopyFrom(node)
        if i in mixed:
            bn.input[3], bn.input[4] = _mixed(g, m, q, axes, node.input[3], node.input[4], i)
        nodes += [*g.nodes, bn]
        g.nodes.clear()
    nodes.append(
        helper.make_node("Concat", [m for m, _ in parts] + [q for _, q in parts], [SAMPLE_STATS], axis=1)
    )
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(g.initializers)
    dtype = _elem_type(out, found[bn_nodes[0]].input[3]) if bn_nodes else onnx.TensorProto.FLOAT
    for i in sorted(mixed):  # the weights have the statistics' type (Mul needs one type)
        for name, value in ((mix_weight(i), 0.0), (mix_variance_gate(i), 1.0)):
            default = np.full((), value, helper.tensor_dtype_to_np_dtype(dtype))
            out.graph.initializer.append(numpy_helper.from_array(default, name))
            out.graph.input.append(helper.make_tensor_value_info(name, dtype, []))
    outputs = [SAMPLE_STATS, *(name for i in sorted(mixed) for name in mixed_statistics(i))]
    out.graph.output.extend(helper.make_tensor_value_info(o, dtype, None) for o in outputs)
    return out
