"""Re-tag a transformed graph from the tagged graph it came from.

Quantizers, ``quant_pre_process``, ONNX Runtime's offline optimizer and its transformer fusions
rebuild nodes and drop node ``metadata_props``. This pass restores a tag on every node by matching
the graph after the transform against the graph before it:

1. a node whose name exists before keeps that node's tag (and source);
2. a node that produces a tensor that existed before replaced the nodes that computed it: it gets
   the deepest common ancestor of their tags (found walking back from its outputs to its inputs);
3. a node named after an old node (``node_MatMul_7_quant``) takes that node's tag;
4. the rest (inserted Q/DQ, scale ``Mul`` nodes, casts) inherit the common ancestor of the nodes
   they serve (consumers), else of their producers, else the root tag.

Only ``metadata_props`` change. Nodes tagged by rules 2-4 get source ``inherited``.
:class:`RetagPass` is this as a pass; :class:`Retagged` runs any pass and re-tags its output from its input.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..hierarchy.graph import tensor_edges
from ..hierarchy.passes import Pass, PassResult
from ..hierarchy.tagger import propagate_tags
from ..hierarchy.tags import TAG_KEY, TAG_SOURCE_KEY, common_ancestor, node_key, node_props, set_node_tag

if TYPE_CHECKING:
    import onnx

__all__ = ["RetagPass", "RetagResult", "Retagged", "retag", "tag_coverage"]

INHERITED = "inherited"
_MAX_REPLACED = 512  # bound on the backward walk of rule 2


@dataclass
class RetagResult:
    """How each node of the new graph got its tag."""

    total: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)
    untagged_before: int = 0

    @property
    def coverage_pct(self) -> float:
        return 100.0 if not self.total else round(100.0 * sum(self.by_rule.values()) / self.total, 3)

    def to_dict(self) -> dict[str, Any]:
        return {"total_nodes": self.total, "by_rule": self.by_rule, "coverage_pct": self.coverage_pct}


@dataclass
class _Before:
    tag_by_name: dict[str, str]
    source_by_name: dict[str, str]
    producer: dict[str, onnx.NodeProto]  # tensor -> node
    root: str | None


def _index_before(model: onnx.ModelProto) -> _Before:
    tags: dict[str, str] = {}
    sources: dict[str, str] = {}
    for node in model.graph.node:
        props = node_props(node)
        if node.name and props.get(TAG_KEY):
            tags[node.name] = props[TAG_KEY]
            sources[node.name] = props.get(TAG_SOURCE_KEY, "scope")
    nodes = model.graph.node
    producer = {t: nodes[i] for t, i in tensor_edges(nodes).producer.items()}
    all_tags = [node_props(n).get(TAG_KEY) for n in model.graph.node]
    return _Before(tags, sources, producer, common_ancestor({t for t in all_tags if t}))


def _replaced_tags(node: onnx.NodeProto, before: _Before, kept_names: set[str]) -> set[str]:
    """Tags of the old nodes between ``node``'s inputs and its outputs (what it replaced).

    Walks back from its outputs to its inputs, then keeps the old nodes that depend on one of its inputs:
    a shape computation shared with another layer (dynamo graphs reuse them) is behind the outputs but
    not after the inputs, and would lift the tag to the two layers' common ancestor. When nothing depends
    on the inputs (they are constants), every node walked is kept.
    """
    stop = set(node.input)
    todo = [before.producer[o] for o in node.output if o in before.producer]
    seen: dict[int, onnx.NodeProto] = {}
    while todo and len(seen) < _MAX_REPLACED:
        old = todo.pop()
        if id(old) in seen:
            continue
        seen[id(old)] = old
        for inp in old.input:
            prev = before.producer.get(inp)
            if inp in stop or prev is None or prev.name in kept_names:
                continue
            todo.append(prev)
    between = _after_inputs(list(seen.values()), stop) or list(seen.values())
    return {t for old in between if (t := before.tag_by_name.get(old.name) or node_props(old).get(TAG_KEY))}


def _after_inputs(nodes: list[onnx.NodeProto], inputs: set[str]) -> list[onnx.NodeProto]:
    """The ``nodes`` that depend, through ``nodes``, on one of the tensors ``inputs``."""
    reached, found, grown = set(inputs), {}, True
    while grown:
        grown = False
        for old in nodes:
            if id(old) not in found and reached.intersection(old.input):
                found[id(old)] = old
                reached.update(old.output)
                grown = True
    return list(found.values())


def _by_prefix(name: str, before: _Before) -> str | None:
    best = ""
    for sep in ("_", "/", "."):
        parts = name.split(sep)
        for i in range(len(parts) - 1, 0, -1):
            cand = sep.join(parts[:i])
            if cand in before.tag_by_name and len(cand) > len(best):
                best = cand
                break
    return before.tag_by_name.get(best) if best else None


def retag(before: onnx.ModelProto, after: onnx.ModelProto) -> RetagResult:
    """Give every node of ``after`` (a ModelProto, changed in place) a tag derived from ``before``."""
    ref = _index_before(before)
    nodes = list(after.graph.node)
    result = RetagResult(
        total=len(nodes), untagged_before=sum(1 for n in before.graph.node if not node_props(n).get(TAG_KEY))
    )
    if ref.root is None:
        return result  # nothing to carry: the input has no tags
    kept_names = {n.name for n in nodes if n.name in ref.tag_by_name}
    tags: dict[int, str] = {}
    sources: dict[int, str] = {}
    rules: Counter[str] = Counter()
    for i, node in enumerate(nodes):
        existing = node_props(node).get(TAG_KEY)
        if node.name in ref.tag_by_name:
            tags[i], sources[i], rule = ref.tag_by_name[node.name], ref.source_by_name[node.name], "kept"
        elif existing:
            tags[i], sources[i], rule = existing, node_props(node).get(TAG_SOURCE_KEY, INHERITED), "kept"
        elif found := common_ancestor(_replaced_tags(node, ref, kept_names)):
            tags[i], rule = found, "replaced"
        elif found := _by_prefix(node.name, ref):
            tags[i], rule = found, "named"
        else:
            continue
        rules[rule] += 1
    if served := propagate_tags(nodes, tags):
        rules["served"] += len(served)
    for i in range(len(nodes)):
        if i not in tags:
            rules["root"] += 1
            tags[i] = ref.root
    for i, node in enumerate(nodes):
        set_node_tag(node, tags[i], sources.get(i, INHERITED))
    result.by_rule = dict(rules)
    return result


@dataclass(frozen=True)
class RetagPass:
    """:func:`retag` as a pass: tags the nodes of its input (in place) from ``reference``."""

    reference: onnx.ModelProto
    name = "retag"
    in_place = True

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        result = retag(self.reference, model)
        return PassResult(model, bool(result.by_rule), {"retag": result.to_dict()})


@dataclass(frozen=True)
class Retagged:
    """Run ``inner`` (a pass that leaves its input untouched), then re-tag its output from its input."""

    inner: Pass
    in_place = False

    def __post_init__(self) -> None:
        if self.inner.in_place:
            raise ValueError(f"{self.inner.name!r} changes its input: nothing left to re-tag from")

    @property
    def name(self) -> str:
        return self.inner.name

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        result = self.inner(model)
        if not result.changed:
            return result
        tagged = RetagPass(model)(result.model)
        return PassResult(tagged.model, True, {**result.record, **tagged.record})


def tag_coverage(model: onnx.ModelProto) -> dict[str, Any]:
    """Tagged nodes / all nodes of the main graph, and the keys of untagged nodes."""
    missing = [node_key(n, i) for i, n in enumerate(model.graph.node) if not node_props(n).get(TAG_KEY)]
    total = len(model.graph.node)
    pct = 100.0 if not total else round(100.0 * (total - len(missing)) / total, 3)
    return {
        "total_nodes": total,
        "tagged_nodes": total - len(missing),
        "coverage_pct": pct,
        "untagged": missing[:20],
    }
