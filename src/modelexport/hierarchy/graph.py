"""A read-only index of a tagged ONNX graph: nodes, tags, tensor edges, initializer sizes, the tag tree.

Every inspect command needs the same lookups (who produces a tensor, who consumes it, which nodes
belong to a module, how large its weights are). Building them once keeps each command a few linear
passes, which is what makes ``analyze`` on a 110M-parameter model take well under a second after load.
Initializer sizes come from dims and dtype, never from the tensor bytes, so nothing large is copied.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import ModuleNotInGraphError

if TYPE_CHECKING:
    import onnx

from .tags import TAG_SOURCE_KEY, common_ancestor, is_within, node_key, node_props, node_tag

__all__ = [
    "GraphIndex",
    "InitializerInfo",
    "TensorEdges",
    "tensor_edges",
    "drop_dead_nodes",
    "index_limits",
    "resolve_module",
    "close_matches",
    "ancestors_of",
    "sidecar_mismatches",
]


@dataclass(frozen=True)
class InitializerInfo:
    """Size of one initializer, computed from its dims and element type."""

    name: str
    dtype: str
    numel: int
    nbytes: int


def _dtype_info(elem_type: int) -> tuple[str, int]:
    import numpy as np
    import onnx

    try:
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return str(np.dtype(np_dtype)), int(np.dtype(np_dtype).itemsize)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower(), 1


def _initializer_info(init: onnx.TensorProto) -> InitializerInfo:
    numel = 1
    for d in init.dims:
        numel *= int(d)
    dtype, itemsize = _dtype_info(init.data_type)
    return InitializerInfo(init.name, dtype, numel, numel * itemsize)


@dataclass(frozen=True)
class TensorEdges:
    """Who produces each tensor and who reads it, as indices into the node list (empty names skipped)."""

    producer: dict[str, int]
    consumers: dict[str, list[int]]


def tensor_edges(nodes: Sequence[onnx.NodeProto]) -> TensorEdges:
    """The one producer/consumer index of a node list: tagging, re-tagging, inspection and extraction use it."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                producer[out] = i
        for inp in node.input:
            if inp:
                consumers[inp].append(i)
    return TensorEdges(producer, consumers)


#: Ops an id tensor passes through unchanged on its way to a ``Gather``.
_PASS_THROUGH = ("Cast", "Identity", "DequantizeLinear", "Unsqueeze", "Reshape", "Flatten", "Squeeze")


def drop_dead_nodes(model: onnx.ModelProto, ops: Collection[str] | None = None) -> int:
    """Remove main-graph nodes (of ``ops`` only, when given) whose outputs nothing reads and no graph output
    names, until none is left; returns how many went. What a rewrite leaves behind (a replaced mask's
    producers, a DequantizeLinear whose MatMul went)."""
    outputs = {o.name for o in model.graph.output}
    removed = 0
    while True:
        used = {i for n in model.graph.node for i in n.input} | outputs
        dead = [
            k
            for k, n in enumerate(model.graph.node)
            if (ops is None or n.op_type in ops) and not any(o in used for o in n.output if o)
        ]
        if not dead:
            return removed
        for k in reversed(dead):
            del model.graph.node[k]
        removed += len(dead)


def _rows(model: onnx.ModelProto, producers: dict[str, Any], name: str) -> int | None:
    """First dimension of a table tensor: an initializer, possibly behind Cast/DequantizeLinear."""
    for _ in range(8):
        init = next((i for i in model.graph.initializer if i.name == name), None)
        if init is not None:
            return int(init.dims[0]) if init.dims else None
        node = producers.get(name)
        if node is None or node.op_type not in _PASS_THROUGH:
            return None
        name = node.input[0]
    return None


def sidecar_mismatches(
    graph: dict[str, dict[str, Any]], sidecar: dict[str, Any], limit: int = 50
) -> list[str]:
    """How a sidecar's node map (``model_hierarchy.json``: ``nodes``) disagrees with the graph's (node key ->
    ``tag`` and ``op_type``, :func:`~.tags.read_node_tags`): nodes in only one of them, another tag or op type
    (at most ``limit`` lines; empty when they agree)."""
    out = [
        f"node {k!r} is in the sidecar but not in the graph" for k in sorted(set(sidecar) - set(graph))[:10]
    ]
    out += [
        f"node {k!r} is in the graph but not in the sidecar" for k in sorted(set(graph) - set(sidecar))[:10]
    ]
    for key, node in graph.items():
        entry = sidecar.get(key)
        if not isinstance(entry, dict):
            continue
        if entry.get("tag") != node["tag"]:
            out.append(f"node {key!r}: tag {node['tag']!r} in the graph, {entry.get('tag')!r} in the sidecar")
        elif entry.get("op_type") not in (None, node["op_type"]):
            out.append(
                f"node {key!r}: op {node['op_type']} in the graph, {entry.get('op_type')} in the sidecar"
            )
        if len(out) >= limit:
            break
    return out[:limit]


def index_limits(model: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> the row count of the smallest table it indexes with ``Gather`` (ids stay in range)."""
    nodes = model.graph.node
    edges = tensor_edges(nodes)
    producers = {t: nodes[i] for t, i in edges.producer.items()}
    consumers = {t: [nodes[i] for i in idx] for t, idx in edges.consumers.items()}
    limits: dict[str, int] = {}
    for inp in model.graph.input:
        frontier, seen = [inp.name], set()
        while frontier:
            t = frontier.pop()
            seen.add(t)
            for n in consumers.get(t, []):
                if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == t:
                    rows = _rows(model, producers, n.input[0])
                    if rows:
                        limits[inp.name] = min(rows, limits.get(inp.name, rows))
                elif n.op_type in _PASS_THROUGH and n.input[0] == t:
                    frontier += [o for o in n.output if o not in seen]
    return limits


def ancestors_of(tag: str) -> list[str]:
    """``/A/B/C`` -> ``['/A', '/A/B', '/A/B/C']`` (each prefix cut once: linear in the tag's levels)."""
    out, cut = [], tag.find("/", 1)
    while cut != -1:
        out.append(tag[:cut])
        cut = tag.find("/", cut + 1)
    out.append(tag)
    return out


@dataclass
class GraphIndex:
    """Node keys, tags and tensor edges of the main graph of a model, in graph (topological) order."""

    keys: list[str]
    op_types: list[str]
    domains: list[str]
    tags: list[str | None]
    sources: list[str | None]
    inputs: list[list[str]]
    outputs: list[list[str]]
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: dict[str, InitializerInfo]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def build(cls, model: onnx.ModelProto) -> GraphIndex:
        """Index ``model.graph`` (one pass over the nodes)."""
        graph = model.graph
        inits = {i.name: _initializer_info(i) for i in graph.initializer}
        index = cls([], [], [], [], [], [], [], [], [o.name for o in graph.output], inits)
        index.graph_inputs = [i.name for i in graph.input if i.name not in inits]
        for i, node in enumerate(graph.node):
            props = node_props(node)
            index.keys.append(node_key(node, i))
            index.op_types.append(node.op_type)
            index.domains.append(node.domain)
            index.tags.append(node_tag(node, i))
            index.sources.append(props.get(TAG_SOURCE_KEY))
            index.inputs.append([t for t in node.input if t])
            index.outputs.append([t for t in node.output if t])
        edges = tensor_edges(graph.node)
        index.producer, index.consumers = edges.producer, edges.consumers
        return index

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def tagged_count(self) -> int:
        return sum(1 for t in self.tags if t)

    @cached_property
    def node_tags(self) -> set[str]:
        """Tags that label at least one node."""
        return {t for t in self.tags if t}

    @cached_property
    def all_tags(self) -> list[str]:
        """Node tags plus every ancestor tag (the module tree as seen from the graph), sorted."""
        return sorted({a for t in self.node_tags for a in ancestors_of(t)})

    def nodes_within(self, tag: str) -> list[int]:
        """Indices of the nodes tagged ``tag`` or one of its descendants, in graph order."""
        return [i for i, t in enumerate(self.tags) if t and is_within(t, tag)]

    def initializer_owner(self) -> dict[str, str | None]:
        """Initializer -> deepest tag containing all its consumers (shared weights go to the common parent)."""
        users: dict[str, set[str]] = defaultdict(set)
        for name in self.initializers:
            for i in self.consumers.get(name, []):
                if self.tags[i]:
                    users[name].add(self.tags[i])
        return {name: common_ancestor(users.get(name, set())) for name in self.initializers}


def close_matches(query: str, candidates: list[str], n: int = 5) -> list[str]:
    """Candidates that look like ``query`` (difflib ratio, then substring hits)."""
    found = difflib.get_close_matches(query, candidates, n=n, cutoff=0.6)
    by_last: dict[str, list[str]] = defaultdict(list)
    for c in candidates:
        by_last[c.rstrip("/").rsplit("/", 1)[-1]].append(c)
    for key in difflib.get_close_matches(query.strip("/").rsplit("/", 1)[-1], list(by_last), n=n, cutoff=0.6):
        found += [c for c in by_last[key] if c not in found]
    lowered = query.lower().strip("/")
    found += [c for c in candidates if lowered and lowered in c.lower() and c not in found]
    return found[:n]


def resolve_module(query: str, index: GraphIndex, sidecar: dict[str, Any] | None = None) -> str:
    """Turn a tag (``/Model/Layer.0``), a tag without its slash, or a module path (``encoder.layer.0``) into a tag.

    Raises :class:`ModuleNotInGraphError` listing close matches when nothing fits.
    """
    tags = index.all_tags
    known = set(tags)
    path_to_tag = {p: t for t, p in (sidecar or {}).get("tags", {}).items()}
    for candidate in (query, "/" + query.lstrip("/")):
        if candidate in known:
            return candidate
    if query in path_to_tag and path_to_tag[query] in known:
        return path_to_tag[query]
    suggestions = close_matches(query, tags + [p for p in path_to_tag if p])
    msg = f"module {query!r} is not in the model ({len(tags)} module tags)"
    if suggestions:
        msg += "; close matches: " + ", ".join(suggestions)
    raise ModuleNotInGraphError(msg)
