"""Tag every node of an exported graph with the module that produced it.

Nodes whose scope the exporter recorded get that module's tag (source ``scope``). The rest
(constants, casts, mask arithmetic, unscoped torchscript nodes) take the deepest common ancestor
of their consumers' tags, else of their producers' (source ``propagated``); a node with no tagged
neighbour at all gets the root tag. Only ``metadata_props`` change: the topology is untouched.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .scopes import module_path_for
from .tags import TAG_KEY, common_ancestor, node_key, set_node_tag
from .tree import ModuleTree

__all__ = ["TaggingResult", "tag_model", "tensor_tags"]


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
        }


def _propagate(
    graph: Any, keys: list[str], tags: dict[str, str], sources: dict[str, str], root_tag: str
) -> None:
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = defaultdict(list)
    for key, node in zip(keys, graph.node, strict=True):
        for out in node.output:
            if out:
                producer[out] = key
        for inp in node.input:
            if inp:
                consumers[inp].append(key)
    nodes = dict(zip(keys, graph.node, strict=True))

    def neighbours(key: str, downstream: bool) -> list[str]:
        node = nodes[key]
        if downstream:
            return [tags[c] for o in node.output for c in consumers.get(o, []) if c in tags]
        return [tags[producer[i]] for i in node.input if i in producer and producer[i] in tags]

    for downstream in (True, False):
        changed = True
        while changed:
            changed = False
            for key in reversed(keys) if downstream else keys:  # visit in the direction tags flow
                if key in tags:
                    continue
                found = common_ancestor(set(neighbours(key, downstream)))
                if found:
                    tags[key], sources[key] = found, "propagated"
                    changed = True
    for key in keys:
        if key not in tags:
            tags[key], sources[key] = root_tag, "propagated"


def _tag_subgraphs(node: Any, tag: str) -> None:
    """Nodes inside Loop/If/Scan bodies carry their container's tag."""
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for sub in g.node:
                set_node_tag(sub, tag, "propagated")
                _tag_subgraphs(sub, tag)


def tag_model(model: Any, tree: ModuleTree, exporter: str) -> TaggingResult:
    """Write ``modelexport.hierarchy_tag`` into every node's metadata and return the mapping."""
    graph = model.graph
    paths = set(tree.modules)
    keys = [node_key(n, i) for i, n in enumerate(graph.node)]
    result = TaggingResult()
    tags: dict[str, str] = {}
    for key, node in zip(keys, graph.node, strict=True):
        result.op_types[key] = node.op_type
        path = module_path_for(exporter, node, paths)
        result.module_paths[key] = path
        if path is not None:
            tags[key] = tree.tag_of(path)
            result.sources[key] = "scope"
    _propagate(graph, keys, tags, result.sources, tree.root_tag)
    for key, node in zip(keys, graph.node, strict=True):
        set_node_tag(node, tags[key], result.sources[key])
        _tag_subgraphs(node, tags[key])
    result.node_tags = tags
    return result


def tensor_tags(model: Any) -> dict[str, dict[str, Any]]:
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
        tag = next((p.value for p in node.metadata_props if p.key == TAG_KEY), None)
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
