"""Graph structure fingerprints: what must be identical between the tagged export and a plain one."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

__all__ = ["TopologyDiff", "graph_structure", "compare_topology"]


def _attr_digest(node: onnx.NodeProto) -> str:
    h = hashlib.sha1()
    for a in sorted(node.attribute, key=lambda a: a.name):
        h.update(a.SerializeToString(deterministic=True))
    return h.hexdigest()[:12]


def graph_structure(model: onnx.ModelProto) -> dict[str, Any]:
    """Nodes (name, op, domain, edges, attributes), initializers, graph inputs/outputs; no metadata."""
    g = model.graph
    return {
        "nodes": [
            (n.name, n.domain, n.op_type, tuple(n.input), tuple(n.output), _attr_digest(n)) for n in g.node
        ],
        "initializers": sorted(
            (
                t.name,
                t.data_type,
                tuple(t.dims),
                hashlib.sha1(t.SerializeToString(deterministic=True)).hexdigest()[:12],
            )
            for t in g.initializer
        ),
        "inputs": [(v.name, v.type.SerializeToString(deterministic=True)) for v in g.input],
        "outputs": [(v.name, v.type.SerializeToString(deterministic=True)) for v in g.output],
        "opsets": sorted((o.domain, o.version) for o in model.opset_import),
    }


@dataclass
class TopologyDiff:
    """Differences between two graphs' structure (empty = identical)."""

    differences: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences


def compare_topology(tagged: onnx.ModelProto, baseline: onnx.ModelProto) -> TopologyDiff:
    a, b = graph_structure(tagged), graph_structure(baseline)
    diff = TopologyDiff()
    if len(a["nodes"]) != len(b["nodes"]):
        diff.differences.append(f"node count {len(a['nodes'])} != baseline {len(b['nodes'])}")
    for i, (x, y) in enumerate(zip(a["nodes"], b["nodes"], strict=False)):
        if x != y:
            diff.differences.append(f"node {i}: {x[:3]} != baseline {y[:3]}")
            if len(diff.differences) > 20:
                break
    for key in ("initializers", "inputs", "outputs", "opsets"):
        if a[key] != b[key]:
            diff.differences.append(f"{key} differ from the baseline")
    return diff
