"""``validate``: ONNX compliance, tag grammar and tree, and node tags vs the sidecar; ``repair``.

Each check is a function registered in :data:`CHECKS` that returns findings; a model is valid when no
check reports an error. ``repair`` makes nodes and sidecar agree again in the direction asked for and
lists every change it made.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_path, write_json
from .._registry import Registry
from ..errors import ConfigError, TagError, first_line
from ..hierarchy.graph import ancestors_of, sidecar_mismatches
from ..hierarchy.tagger import tensor_tags
from ..hierarchy.tags import TAG_PATTERN, node_tag, set_node_tag
from ..onnxfile import load_onnx
from .formats import renderer
from .loading import ModelLike, SidecarLike, TaggedModel, load_tagged_model

__all__ = ["Finding", "ValidationReport", "RepairResult", "CHECKS", "validate", "validate_model", "repair"]

KNOWN_SOURCES = ("scope", "propagated", "inherited")


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # "error" | "warning"
    message: str


@dataclass
class ValidationReport:
    model: str
    checks: list[str]
    findings: list[Finding] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ok": self.ok,
            "checks": self.checks,
            "findings": [asdict(f) for f in self.findings],
            **self.extra,
        }


Check = Callable[[TaggedModel], list[Finding]]
#: name -> check; ``consistency`` runs only when asked for (it needs the sidecar).
CHECKS: Registry[Check] = Registry("check")


@CHECKS.register("onnx_checker")
def _onnx_checker(tm: TaggedModel) -> list[Finding]:
    """Full ``onnx.checker`` with strict shape inference; from the path so external data is found."""
    import onnx

    # ValueError: the checker's C++ raises it for values it cannot name (a data type 0 in a value_info)
    errors = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError)
    try:
        onnx.checker.check_model(str(tm.path) if tm.path else tm.proto, full_check=True)
    except errors as exc:
        if not (tm.path and "external tensors" in str(exc)):
            return [Finding("onnx_checker", "error", first_line(exc))]
        try:  # shape inference cannot read external data by path: check the loaded model instead
            onnx.checker.check_model(load_onnx(tm.path), full_check=True)
        except errors as again:
            return [Finding("onnx_checker", "error", first_line(again))]
    return []


@CHECKS.register("tag_format")
def _tag_format(tm: TaggedModel) -> list[Finding]:
    index = tm.index
    if not index.tagged_count:
        return [
            Finding("tag_format", "error", "no node carries a hierarchy tag (not exported by modelexport?)")
        ]
    out = []
    bad = sorted({t for t in index.node_tags if not TAG_PATTERN.match(t)})
    out += [Finding("tag_format", "error", f"malformed tag {t!r}") for t in bad[:20]]
    untagged = [k for k, t in zip(index.keys, index.tags, strict=True) if not t]
    if untagged:
        out.append(
            Finding("tag_format", "error", f"{len(untagged)} untagged node(s): {', '.join(untagged[:5])}")
        )
    sources = sorted(
        {s for s, t in zip(index.sources, index.tags, strict=True) if t and s not in KNOWN_SOURCES}
    )
    if sources:
        out.append(
            Finding(
                "tag_format", "warning", f"unknown tag sources {sources}; known: {', '.join(KNOWN_SOURCES)}"
            )
        )
    return out


def _sibling_clashes(tags: set[str]) -> list[str]:
    """A class segment appearing both with and without an instance suffix under one parent."""
    by_parent: dict[str, set[str]] = defaultdict(set)
    for t in tags:
        parent, _, seg = t.rpartition("/")
        by_parent[parent].add(seg)
    out = []
    for parent, segs in by_parent.items():
        for seg in segs:
            if "." not in seg and any(s.startswith(seg + ".") for s in segs):
                out.append(f"{parent}/{seg} and indexed siblings {parent}/{seg}.N")
    return sorted(out)


@CHECKS.register("tag_tree")
def _tag_tree(tm: TaggedModel) -> list[Finding]:
    tags = {t for t in tm.index.node_tags if TAG_PATTERN.match(t)}
    if not tags:
        return []
    out = []
    roots = sorted({ancestors_of(t)[0] for t in tags})
    if len(roots) > 1:
        out.append(Finding("tag_tree", "error", f"{len(roots)} root modules: {', '.join(roots[:5])}"))
    out += [Finding("tag_tree", "warning", f"ambiguous instance suffix: {c}") for c in _sibling_clashes(tags)]
    known = set((tm.sidecar or {}).get("tags") or {})
    if known:
        out += [
            Finding("tag_tree", "error", f"tag {t} is not a module of the sidecar's module tree")
            for t in sorted(tags - known)[:20]
        ]
        orphans = sorted(t for t in known if t.count("/") > 1 and t.rpartition("/")[0] not in known)
        out += [
            Finding("tag_tree", "error", f"parent of {t} is missing from the module tree")
            for t in orphans[:20]
        ]
    return out


def _tensor_findings(tm: TaggedModel) -> list[Finding]:
    recorded = (tm.sidecar or {}).get("tensors") or {}
    actual = tensor_tags(tm.proto)
    out = []
    for name in sorted(set(recorded) ^ set(actual))[:10]:
        where = "sidecar only" if name in recorded else "graph only"
        out.append(Finding("consistency", "error", f"tensor {name!r} is in the {where}"))
    for name in sorted(set(recorded) & set(actual)):
        r, a = recorded[name], actual[name]
        if r.get("producer") != a["producer"] or sorted(r.get("consumers") or []) != sorted(a["consumers"]):
            out.append(
                Finding("consistency", "error", f"tensor {name!r}: sidecar tags differ from the graph edges")
            )
    return out[:30]


@CHECKS.register("consistency")
def _consistency(tm: TaggedModel) -> list[Finding]:
    """Node metadata vs ``model_hierarchy.json``: same nodes, same tags and op types, same tensor tags."""
    if tm.sidecar is None:
        return [
            Finding(
                "consistency", "error", "no model_hierarchy.json beside the model (pass --hierarchy FILE)"
            )
        ]
    index = tm.index
    graph = {
        k: {"tag": t, "op_type": op} for k, t, op in zip(index.keys, index.tags, index.op_types, strict=True)
    }
    mismatches = sidecar_mismatches(graph, tm.sidecar.get("nodes") or {})
    return [Finding("consistency", "error", m) for m in mismatches] + _tensor_findings(tm)


DEFAULT_CHECKS = ("onnx_checker", "tag_format", "tag_tree")


def validate_model(tm: TaggedModel, checks: tuple[str, ...] = DEFAULT_CHECKS) -> ValidationReport:
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ConfigError(f"unknown checks {unknown}; valid: {', '.join(CHECKS)}")
    report = ValidationReport(tm.name, list(checks))
    for name in checks:
        report.findings += CHECKS[name](tm)
    return report


def validate(
    model: ModelLike, *, check_consistency: bool = False, hierarchy: SidecarLike = None
) -> ValidationReport:
    """Validate a model file (or ModelProto); ``check_consistency`` adds the sidecar comparison."""
    tm = load_tagged_model(model, hierarchy=hierarchy, weights=False)
    checks = DEFAULT_CHECKS + (("consistency",) if check_consistency else ())
    return validate_model(tm, checks)


# -- repair --------------------------------------------------------------------------------------
@dataclass
class RepairResult:
    direction: str
    written: str | None
    changes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nodes_from_sidecar(tm: TaggedModel) -> list[str]:
    entries = tm.sidecar.get("nodes") or {}
    changes = []
    for key, node in zip(tm.index.keys, tm.proto.graph.node, strict=True):
        entry = entries.get(key)
        current = node_tag(node)
        if entry and entry.get("tag") and entry["tag"] != current:
            set_node_tag(node, entry["tag"], entry.get("source"))
            changes.append(f"node {key}: {current!r} -> {entry['tag']!r}")
    return changes


def _sidecar_from_nodes(tm: TaggedModel) -> list[str]:
    entries: dict[str, Any] = tm.sidecar.setdefault("nodes", {})
    index, changes = tm.index, []
    for key in sorted(set(entries) - set(index.keys)):
        del entries[key]
        changes.append(f"sidecar node {key} removed (not in the graph)")
    for key, tag, src, op in zip(index.keys, index.tags, index.sources, index.op_types, strict=True):
        old = entries.get(key, {})
        if old.get("tag") != tag or old.get("op_type") != op:
            entries[key] = {**old, "tag": tag, "source": src, "op_type": op}
            changes.append(f"sidecar node {key}: {old.get('tag')!r} -> {tag!r}")
    if tm.sidecar.get("tensors") != (tensors := tensor_tags(tm.proto)):
        tm.sidecar["tensors"] = tensors
        changes.append("sidecar tensor tags recomputed from the graph")
    return changes


def _load_for_rewrite(tm: TaggedModel, target: Path) -> TaggedModel:
    """Full model for saving to ``target``: external data stays external when it stays in the same folder."""
    same_dir = target.resolve().parent == tm.path.resolve().parent
    proto = load_onnx(tm.path, external_data=not same_dir)
    return TaggedModel(proto, tm.path, tm.sidecar, tm.sidecar_path)


def repair(
    model: ModelLike, *, direction: str = "nodes", hierarchy: SidecarLike = None, output: str | None = None
) -> RepairResult:
    """``nodes``: rewrite node tags from the sidecar; ``sidecar``: rewrite the sidecar from the nodes.

    Writes only when something changed: the model to ``output`` (default: in place), or the sidecar in place.
    """
    import onnx

    if direction not in ("nodes", "sidecar"):
        raise ConfigError(f"repair direction must be 'nodes' or 'sidecar', got {direction!r}")
    tm = load_tagged_model(model, hierarchy=hierarchy, weights=False)
    if tm.sidecar is None or tm.path is None or (direction == "sidecar" and tm.sidecar_path is None):
        raise TagError(
            f"cannot repair {tm.name}: no model_hierarchy.json file beside it", hint="pass --hierarchy FILE"
        )
    if direction == "sidecar":
        changes, target = _sidecar_from_nodes(tm), tm.sidecar_path
        if changes:
            write_json(target, tm.sidecar)
        return RepairResult(direction, str(target) if changes else None, changes)
    target = Path(output or tm.path)
    changes = _nodes_from_sidecar(tm)
    if changes:
        full = _load_for_rewrite(tm, target)
        _nodes_from_sidecar(full)
        with atomic_path(target) as tmp:
            onnx.save_model(full.proto, str(tmp))
    return RepairResult(direction, str(target) if changes else None, changes)


@renderer("validate", "text")
def _text(r: ValidationReport) -> str:
    lines = [f"{r.model}: {'valid' if r.ok else 'INVALID'} (checks: {', '.join(r.checks)})"]
    lines += [f"  [{f.severity}] {f.check}: {f.message}" for f in r.findings]
    return "\n".join(lines) + "\n"


@renderer("validate", "json")
def _json(r: ValidationReport) -> str:
    return json.dumps(r.to_dict(), indent=2) + "\n"
