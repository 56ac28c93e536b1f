"""Tag every node of an exported graph with the module that produced it.

Nodes whose scope the exporter recorded get that module's tag (source ``scope``). The rest
(constants, casts, mask arithmetic, unscoped torchscript nodes) take the deepest common ancestor
of their consumers' tags, else of their producers' (source ``propagated``); a node with no tagged
neighbour at all gets the root tag. Only ``metadata_props`` change: the topology is untouched (the
exporter's stack traces lose the exporting machine's absolute paths).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .graph import ancestors_of, tensor_edges
from .scopes import module_path_for
from .tags import common_ancestor, node_key, node_tag, portable_stack_trace, set_node_tag
from .tree import ModuleTree

if TYPE_CHECKING:
    import onnx

__all__ = ["TaggingResult", "propagate_tags", "tag_model", "tensor_tags"]


@dataclass
class TaggingResult:
    """Per node: tag, how it was found, the module path (scoped nodes)."""

    node_tags: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    module_paths: dict[str, str | None] = field(default_factory=dict)
    op_types: dict[str, str] = field(default_factory=dict)

    @property
    def coverage(self) -> dict[str, Any]:
        total = len(self.op_types)
        tagged = sum(1 for k in self.op_types if self.node_tags.get(k))
        by_source: dict[str, int] = defaultdict(int)
        for k in self.op_types:
            by_source[self.sources.get(k, "none")] += 1
        return {
            "total_nodes": total,
            "tagged_nodes": tagged,
            "coverage_pct": round(100.0 * tagged / total, 3) if total else 100.0,
            "by_source": dict(by_source),
            "unique_tags": len(set(self.node_tags.values())),
            # the module tree as analyze and report count it: the tags and their ancestors
            "modules": len({a for t in set(self.node_tags.values()) if t for a in ancestors_of(t)}),
        }


def propagate_tags(nodes: Sequence[onnx.NodeProto], tags: dict[int, str]) -> list[int]:
    """Tag untagged nodes (by index into ``nodes``) from their neighbours; returns the indices it tagged.

    First downstream to a fixed point: a node takes the deepest common ancestor of its consumers'
    tags (a constant or cast belongs to the module that uses it). Then upstream: the rest take the
    common ancestor of their producers'. Nodes with no tagged neighbour stay untagged (the caller
    decides: the root tag, or a count). The one propagation used by tagging and by re-tagging.
    """
    edges = tensor_edges(nodes)
    producer, consumers = edges.producer, edges.consumers

    def near(i: int, downstream: bool) -> set[str]:
        node = nodes[i]
        if downstream:
            return {tags[c] for o in node.output for c in consumers.get(o, ()) if c in tags}
        return {tags[producer[x]] for x in node.input if producer.get(x) in tags}

    added: list[int] = []
    for downstream in (True, False):
        changed = True
        while changed:
            changed = False
            order = range(len(nodes) - 1, -1, -1) if downstream else range(len(nodes))
            for i in order:  # visit in the direction tags flow
                if i not in tags and (found := common_ancestor(near(i, downstream))):
                    tags[i] = found
                    added.append(i)
                    changed = True
    return added


def _tag_subgraphs(node: onnx.NodeProto, tag: str) -> None:
    """Nodes inside Loop/If/Scan bodies carry their container's tag."""
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for sub in g.node:
                set_node_tag(sub, tag, "propagated")
                _tag_subgraphs(sub, tag)


def tag_model(model: onnx.ModelProto, tree: ModuleTree, exporter: str) -> TaggingResult:
    """Write ``modelexport.hierarchy_tag`` into every node's metadata and return the mapping."""
    graph = model.graph
    paths = set(tree.modules)
    keys = [node_key(n, i) for i, n in enumerate(graph.node)]
    result = TaggingResult()
    tags: dict[int, str] = {}
    for i, (key, node) in enumerate(zip(keys, graph.node, strict=True)):
        result.op_types[key] = node.op_type
        path = module_path_for(exporter, node, paths)
        result.module_paths[key] = path
        if path is not None:
            tags[i] = tree.tag_of(path)
            result.sources[key] = "scope"
    propagate_tags(graph.node, tags)
    for i, (key, node) in enumerate(zip(keys, graph.node, strict=True)):
        tag = tags.setdefault(i, tree.root_tag)  # no tagged neighbour at all: the root
        result.sources.setdefault(key, "propagated")
        set_node_tag(node, tag, result.sources[key])
        portable_stack_trace(node)  # no path of the exporting machine in the package
        _tag_subgraphs(node, tag)
        result.node_tags[key] = tag
    return result


def tensor_tags(model: onnx.ModelProto) -> dict[str, dict[str, Any]]:
    """Tensor -> producer module tag and ALL consumer module tags (R13), read from node metadata."""
    graph = model.graph
    out: dict[str, dict[str, Any]] = {}
    graph_outputs = {o.name for o in graph.output}

    def entry(name: str, kind: str) -> dict[str, Any]:
        return out.setdefault(name, {"kind": kind, "producer": None, "consumers": []})

    for inp in graph.input:
        entry(inp.name, "input")
    for init in graph.initializer:
        entry(init.name, "initializer")
    for node in graph.node:
        tag = node_tag(node)
        for o in node.output:
            if o:
                e = entry(o, "output" if o in graph_outputs else "activation")
                e["producer"] = tag
        for i in node.input:
            if i:
                e = entry(i, "activation")
                if tag and tag not in e["consumers"]:
                    e["consumers"].append(tag)
    return out
