"""Cut one module out of a tagged ONNX model as a standalone, runnable model (R13).

The module's nodes are those whose tag is the module's tag or below it (children included). The
boundary follows the tensor edges: a tensor produced outside and read inside is an input, a tensor
produced inside and read outside (or a graph output) is an output; the rest are internal. Weights
the nodes read are carried as initializers, and constant-only producers outside the module (a
``Constant`` feeding a ``Reshape``) are copied in, so the subgraph needs only real activations.

A module called more than once (``call_count`` > 1 in the sidecar) shares one tag across its call
sites. Its nodes are split into call instances: the graph is in execution order, so the n-th equal
slice of the module's nodes (same op-type sequence in every slice) is the n-th call. ``call`` picks
one (0 = first, the default) or ``"all"`` keeps every call site as one region. Without the sidecar
the call count is inferred: the largest split whose slices repeat the same ops over the same weights.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ExportError, TagError, first_line
from ..hierarchy.graph import GraphIndex, resolve_module
from ..onnxfile import OutputPlan, external_tensors, load_external_tensors, plan_output, save_onnx
from .loading import ModelLike, SidecarLike, load_tagged_model

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ModuleSubgraph",
    "extract_module_subgraph",
    "extract_plan",
    "subgraph_file_name",
    "call_instances",
    "module_boundary",
]


@dataclass
class ModuleSubgraph:
    """What was cut out, where its boundary lies, and the standalone model."""

    tag: str
    module_path: str | None
    operations: list[dict[str, Any]]
    external_inputs: list[str]
    outputs: list[str]
    internal_tensors: list[str]
    boundary_operations: list[str]
    initializers: list[str]
    carried_constants: list[str]
    call_index: int | None
    call_count: int
    model: onnx.ModelProto | None = field(repr=False, default=None)
    notes: list[str] = field(default_factory=list)
    #: The files the subgraph was cut from (the model, its sidecar): never written over.
    sources: tuple[Path, ...] = field(repr=False, default=())

    def to_dict(self) -> dict[str, Any]:
        """Everything but the model itself and its sources (JSON-ready)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("model", "sources")}

    def save(
        self,
        output: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        inputs: Iterable[str | os.PathLike[str] | None] = (),
    ) -> Path:
        """Write the subgraph as ONNX, atomically (with external data when its weights pass the threshold),
        by the one output rule (:func:`extract_plan`); returns the file written."""
        plan = extract_plan(output, self.module_path or self.tag, [*self.sources, *inputs], overwrite)
        return save_onnx(self.model, plan.path)


def subgraph_file_name(module: str) -> str:
    """The file ``extract -o DIR/`` writes: the module's last tag level or its path (``BertLayer.0.onnx``)."""
    name = module.strip().strip("/").split("/")[-1] or "module"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".onnx"


def extract_plan(
    output: str | os.PathLike[str],
    module: str,
    inputs: Iterable[str | os.PathLike[str] | None],
    overwrite: bool = False,
) -> OutputPlan:
    """Where a subgraph of ``module`` goes (the one output rule, checked before any work): ``SUB.onnx``, or
    :func:`subgraph_file_name` in a folder (``DIR/``, or any path not ending in ``.onnx``)."""
    return plan_output(
        output, subgraph_file_name(module), inputs=inputs, bare_is_folder=True, overwrite=overwrite
    )


def _slices(core: list[int], count: int) -> list[list[int]] | None:
    if count < 2 or len(core) % count:
        return None
    size = len(core) // count
    return [core[k * size : (k + 1) * size] for k in range(count)]


def _same_ops(index: GraphIndex, chunks: list[list[int]]) -> bool:
    first = [index.op_types[i] for i in chunks[0]]
    return all([index.op_types[i] for i in c] == first for c in chunks[1:])


def _weights(index: GraphIndex, chunk: list[int]) -> set[str]:
    return {t for i in chunk for t in index.inputs[i] if t in index.initializers}


def _infer_count(index: GraphIndex, core: list[int]) -> int:
    """Largest k whose k slices repeat the same ops over the same (non-empty) weights."""
    for k in range(len(core) // 2, 1, -1):
        chunks = _slices(core, k)
        if chunks and _same_ops(index, chunks):
            w = _weights(index, chunks[0])
            if w and all(_weights(index, c) == w for c in chunks[1:]):
                return k
    return 1


def call_instances(index: GraphIndex, members: list[int], count: int | None) -> list[list[int]] | None:
    """Split a module's nodes into its call sites (``None`` if they do not split into equal calls).

    ``count`` comes from the sidecar; ``None`` infers it. Nodes that read only weights (constants)
    go with the call of their first consumer.
    """
    member_set = set(members)
    core = [i for i in members if any(t not in index.initializers for t in index.inputs[i])]
    count = _infer_count(index, core) if count is None else count
    chunks = _slices(core, count)
    if chunks is None or not _same_ops(index, chunks):
        return None if count > 1 else [list(members)]
    owner = {i: k for k, c in enumerate(chunks) for i in c}
    for i in members:
        if i not in owner:
            users = [
                c
                for t in index.outputs[i]
                for c in index.consumers.get(t, [])
                if c in member_set and c in owner
            ]
            chunks[owner[min(users)] if users else 0].append(i)
    return [sorted(c) for c in chunks]


def _subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors read inside If/Loop/Scan bodies (implicit inputs)."""
    out: list[str] = []
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                out += [t for t in list(n.input) + _subgraph_reads(n) if t and t not in defined]
                defined.update(n.output)
    return out


def _reads(model: onnx.ModelProto, index: GraphIndex, i: int) -> list[str]:
    node = model.graph.node[i]
    extra = _subgraph_reads(node) if any(a.HasField("g") or a.graphs for a in node.attribute) else []
    return index.inputs[i] + [t for t in extra if t not in index.inputs[i]]


def _constant_closure(model: onnx.ModelProto, index: GraphIndex, selected: set[int]) -> list[int]:
    """Outside producers that depend only on weights/constants and feed the selection."""
    memo: dict[int, bool] = {}

    def is_const(i: int) -> bool:
        if i not in memo:
            memo[i] = False  # cycles cannot happen in a DAG; guard anyway
            node = model.graph.node[i]
            memo[i] = not any(a.HasField("g") or a.graphs for a in node.attribute) and all(
                t in index.initializers or (t in index.producer and is_const(index.producer[t]))
                for t in index.inputs[i]
            )
        return memo[i]

    pulled: set[int] = set()
    stack = [t for i in selected for t in _reads(model, index, i)]
    while stack:
        t = stack.pop()
        p = index.producer.get(t)
        if p is None or p in selected or p in pulled or not is_const(p):
            continue
        pulled.add(p)
        stack.extend(index.inputs[p])
    return sorted(pulled)


@dataclass
class _Boundary:
    inputs: list[str]
    outputs: list[str]
    internal: list[str]
    weights: list[str]
    boundary_ops: list[str]


def _boundary(model: onnx.ModelProto, index: GraphIndex, nodes: list[int], copied: set[int]) -> _Boundary:
    """Inputs, outputs and internal tensors of ``nodes``; ``copied`` constants never make outputs."""
    chosen = set(nodes)
    produced = {t: i for i in nodes for t in index.outputs[i]}
    graph_outputs = set(index.graph_outputs)
    inputs: list[str] = []
    weights: list[str] = []
    ops: set[int] = set()
    for i in nodes:
        for t in _reads(model, index, i):
            if t in produced:
                continue
            if t in index.initializers:
                if t not in weights:
                    weights.append(t)
            else:
                if t not in inputs:
                    inputs.append(t)
                ops.add(i)
    outputs, internal = [], []
    for t, i in produced.items():
        outside = any(c not in chosen for c in index.consumers.get(t, []))
        if i not in copied and (outside or t in graph_outputs):
            outputs.append(t)
            ops.add(i)
        else:
            internal.append(t)
    return _Boundary(inputs, outputs, internal, weights, [index.keys[i] for i in sorted(ops)])


def module_boundary(model: onnx.ModelProto, index: GraphIndex, tag: str) -> dict[str, list[str]]:
    """What ``extract --call all`` would cut for ``tag``: its input, output and weight tensors (no model built)."""
    nodes = index.nodes_within(tag)
    pulled = _constant_closure(model, index, set(nodes))
    b = _boundary(model, index, sorted(set(nodes) | set(pulled)), set(pulled))
    return {"inputs": b.inputs, "outputs": b.outputs, "weights": b.weights}


def _value_infos(model: onnx.ModelProto, names: set[str]) -> dict[str, onnx.ValueInfoProto]:
    """Typed value infos for ``names``, running shape inference on the full model only if needed."""
    import onnx

    g = model.graph
    known = {
        v.name: v
        for v in list(g.input) + list(g.output) + list(g.value_info)
        if v.type.HasField("tensor_type")
    }
    known.update(
        {
            i.name: onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
            for i in g.initializer
            if i.name in names
        }
    )
    missing = {n for n in names if n not in known or not known[n].type.tensor_type.elem_type}
    if missing:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        known.update({v.name: v for v in inferred.graph.value_info if v.name in missing})
    return {n: known[n] for n in names if n in known}


def _typed(name: str, infos: dict[str, onnx.ValueInfoProto]) -> onnx.ValueInfoProto:
    import onnx

    vi = infos.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        raise ExportError(
            f"cannot determine the type of tensor {name!r} at the module boundary",
            hint="run onnx shape inference on the model first",
        )
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    return out


def _checkable(sub: onnx.ModelProto) -> onnx.ModelProto:
    """``sub`` with its external-data weights as typed graph inputs: the checker then validates the graph
    without reading (or, relative to the working directory, failing to find) files on disk."""
    import onnx

    external = {t.name: t for t in external_tensors(sub)}
    if not external:
        return sub
    view = onnx.ModelProto()
    view.CopyFrom(sub)  # small: the external weights are references
    kept = [t for t in view.graph.initializer if t.name not in external]
    del view.graph.initializer[:]
    view.graph.initializer.extend(kept)
    view.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in external.values()
    )
    return view


def _build_model(
    model: onnx.ModelProto, index: GraphIndex, nodes: list[int], b: _Boundary, tag: str
) -> onnx.ModelProto:
    import onnx

    infos = _value_infos(model, set(b.inputs) | set(b.outputs) | set(b.internal))
    graph = onnx.GraphProto(name=f"extract{tag.replace('/', '_')}")
    graph.node.extend(model.graph.node[i] for i in nodes)
    graph.input.extend(_typed(t, infos) for t in b.inputs)
    graph.output.extend(_typed(t, infos) for t in b.outputs)
    graph.value_info.extend(infos[t] for t in b.internal if t in infos)
    wanted = set(b.weights)
    graph.initializer.extend(i for i in model.graph.initializer if i.name in wanted)
    sub = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    sub.producer_name, sub.producer_version = "modelexport-extract", model.producer_version
    sub.functions.extend(model.functions)
    onnx.helper.set_model_props(sub, {"modelexport.extracted_module": tag})
    try:
        onnx.checker.check_model(_checkable(sub))
        return onnx.shape_inference.infer_shapes(sub, strict_mode=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ExportError(f"the subgraph of {tag} is not a valid ONNX model: {first_line(exc)}") from exc


def _select_call(
    index: GraphIndex, tag: str, members: list[int], count: int | None, call: int | str
) -> tuple[list[int], int | None, int, list[str]]:
    if call == "all":
        return members, None, count or 1, []
    instances = call_instances(index, members, count)
    if instances is None:
        if call not in (0, None):
            raise TagError(
                f"{tag} is called {count} times but its nodes do not split into equal call sites; use call='all'"
            )
        note = f"{tag} is called {count} times but its nodes do not split into equal calls; extracted all call sites together"
        return members, None, count or 1, [note]
    call = 0 if call is None else call
    if not isinstance(call, int) or not 0 <= call < len(instances):
        raise TagError(
            f"call {call!r} is out of range: {tag} has {len(instances)} call site(s) (0..{len(instances) - 1}, or 'all')",
            hint=f"pass --call with a number from 0 to {len(instances) - 1}, or --call all",
        )
    notes = [f"{tag} is called {len(instances)} times; extracted call {call}"] if len(instances) > 1 else []
    return instances[call], call, len(instances), notes


def _sidecar_call_count(sidecar: dict[str, Any] | None, path: str | None) -> int | None:
    if sidecar is None or path is None:
        return None
    count = sidecar.get("modules", {}).get(path, {}).get("call_count")
    return int(count) if count else None


def extract_module_subgraph(
    onnx_model: ModelLike,
    hierarchy_metadata: SidecarLike,
    target_module: str,
    *,
    call: int | str = 0,
) -> ModuleSubgraph:
    """Extract ``target_module`` (a tag like ``/BertModel/BertEncoder/BertLayer.0`` or a module path).

    ``onnx_model``: a ``ModelProto``, a path or an export folder. ``hierarchy_metadata``: the sidecar
    (dict or path); ``None`` uses the one beside a model file if there is one, ``False`` ignores it (the
    node tags alone suffice). ``call``: which call site of a module called several times (0-based), or
    ``"all"``.
    """
    tm = load_tagged_model(onnx_model, hierarchy=hierarchy_metadata, external_data=False)
    index, sidecar = tm.index, tm.sidecar
    if not index.node_tags:
        raise TagError(
            f"{tm.name} has no hierarchy tags; nothing to extract by module",
            hint="export it with modelexport first",
        )
    tag = resolve_module(target_module, index, sidecar)
    path = (sidecar or {}).get("tags", {}).get(tag)
    members = index.nodes_within(tag)
    nodes, call_index, count, notes = _select_call(
        index, tag, members, _sidecar_call_count(sidecar, path), call
    )
    pulled = _constant_closure(tm.proto, index, set(nodes))
    selected = sorted(set(nodes) | set(pulled))
    b = _boundary(tm.proto, index, selected, set(pulled))
    if not b.outputs:
        raise TagError(f"{tag} produces no tensor that is used outside it; nothing to extract")
    sub = _build_model(tm.proto, index, selected, b, tag)
    if tm.data_dir is not None:  # only the module's own weights are read from the external data
        load_external_tensors(sub, tm.data_dir)
    ops = [{"name": index.keys[i], "op_type": index.op_types[i], "tag": index.tags[i]} for i in selected]
    return ModuleSubgraph(
        tag,
        path,
        ops,
        b.inputs,
        b.outputs,
        b.internal,
        b.boundary_ops,
        b.weights,
        [index.keys[i] for i in pulled],
        call_index,
        count,
        sub,
        notes,
        tuple(p for p in (tm.path, tm.sidecar_path) if p is not None),
    )
