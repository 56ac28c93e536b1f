"""``analyze``: which module owns which operations and weights.

Per module tag: its own nodes and op types, and totals including its children; parameters and
bytes from the initializers its nodes read (a weight shared by several modules counts once, at their
common parent). Works on untagged models too: the op statistics are still reported.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..hierarchy.graph import ancestors_of
from .formats import renderer
from .loading import ModelLike, TaggedModel, load_tagged_model

__all__ = ["AnalyzeConfig", "ModuleStats", "Analysis", "analyze", "analyze_model"]


@dataclass(frozen=True)
class AnalyzeConfig:
    """What to show: a tag filter (substring or glob) and a depth limit for the module tree."""

    filter_tag: str | None = None
    depth: int | None = None
    top_ops: int = 4

    def __post_init__(self) -> None:
        if self.depth is not None and self.depth < 1:
            raise ConfigError(f"depth must be >= 1 (1 = the root module only), got {self.depth}")
        if self.top_ops < 1:
            raise ConfigError(f"top_ops must be >= 1, got {self.top_ops}")

    def matches(self, tag: str) -> bool:
        if not self.filter_tag:
            return True
        pattern = self.filter_tag
        if any(ch in pattern for ch in "*?["):
            return fnmatch.fnmatchcase(tag, pattern) or fnmatch.fnmatchcase(tag, f"*{pattern}*")
        return pattern in tag


@dataclass
class ModuleStats:
    """Self (own nodes) and total (with children) statistics of one module tag."""

    tag: str
    depth: int
    module_path: str | None = None
    nodes: int = 0
    total_nodes: int = 0
    op_types: dict[str, int] = field(default_factory=dict)
    total_op_types: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    total_parameters: int = 0
    bytes: int = 0
    total_bytes: int = 0


@dataclass
class Analysis:
    """The whole analysis; ``modules`` is in tree order, ``nodes`` one row per node."""

    model: str
    opset: int
    total_nodes: int
    tagged_nodes: int
    op_types: dict[str, int]
    sources: dict[str, int]
    parameters: int
    bytes: int
    modules: list[ModuleStats]
    untagged: list[str]
    nodes: list[dict[str, Any]]
    has_sidecar: bool
    notes: list[str] = field(default_factory=list)

    @property
    def tagged_pct(self) -> float:
        return round(100.0 * self.tagged_nodes / self.total_nodes, 2) if self.total_nodes else 100.0

    @property
    def has_tags(self) -> bool:
        return self.tagged_nodes > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tagged_pct"] = self.tagged_pct
        return data


def _module_stats(tm: TaggedModel) -> dict[str, ModuleStats]:
    index = tm.index
    paths = {t: p for t, p in ((tm.sidecar or {}).get("tags") or {}).items()}
    stats = {t: ModuleStats(t, t.count("/"), paths.get(t)) for t in index.all_tags}
    own_ops: dict[str, Counter[str]] = defaultdict(Counter)
    for tag, op in zip(index.tags, index.op_types, strict=True):
        if tag:
            own_ops[tag][op] += 1
    for name, owner in index.initializer_owner().items():
        if owner:
            info = index.initializers[name]
            stats[owner].parameters += info.numel
            stats[owner].bytes += info.nbytes
    for tag, s in stats.items():
        s.op_types = dict(own_ops[tag].most_common())
        s.nodes = sum(s.op_types.values())
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for tag, s in stats.items():
        for anc in ancestors_of(tag):
            a = stats[anc]
            totals[anc].update(own_ops[tag])
            a.total_parameters += s.parameters
            a.total_bytes += s.bytes
    for tag, s in stats.items():
        s.total_op_types = dict(totals[tag].most_common())
        s.total_nodes = sum(s.total_op_types.values())
    return stats


def analyze_model(tm: TaggedModel, config: AnalyzeConfig | None = None) -> Analysis:
    """Analyze an already loaded model."""
    cfg = config or AnalyzeConfig()
    index = tm.index
    stats = _module_stats(tm)
    shown = [
        s for t, s in sorted(stats.items()) if cfg.matches(t) and (cfg.depth is None or s.depth <= cfg.depth)
    ]
    rows = [
        {"node": k, "op_type": op, "tag": tag, "source": src}
        for k, op, tag, src in zip(index.keys, index.op_types, index.tags, index.sources, strict=True)
        if tag is None or cfg.matches(tag)
    ]
    notes = (
        [] if index.tagged_count else ["this model has no hierarchy tags: only op statistics are available"]
    )
    if cfg.filter_tag and index.tagged_count and not shown:
        notes.append(f"no module tag matches {cfg.filter_tag!r}")
    return Analysis(
        model=tm.name,
        opset=tm.opset,
        total_nodes=len(index),
        tagged_nodes=index.tagged_count,
        op_types=dict(Counter(index.op_types).most_common()),
        sources=dict(Counter(s or "untagged" for s in index.sources).most_common()),
        parameters=sum(i.numel for i in index.initializers.values()),
        bytes=sum(i.nbytes for i in index.initializers.values()),
        modules=shown,
        untagged=[k for k, t in zip(index.keys, index.tags, strict=True) if not t],
        nodes=rows,
        has_sidecar=tm.sidecar is not None,
        notes=notes,
    )


def analyze(model: ModelLike, config: AnalyzeConfig | None = None, **options: object) -> Analysis:
    """Load ``model`` (path, folder or ModelProto) without its external weights and analyze it."""
    cfg = config or AnalyzeConfig(**options)
    return analyze_model(load_tagged_model(model, weights=False), cfg)


# -- renderers -----------------------------------------------------------------------------------
def _human(n: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


def _ops(ops: dict[str, int], k: int) -> str:
    items = list(ops.items())
    text = ", ".join(f"{op}x{n}" for op, n in items[:k])
    return text + (f", +{len(items) - k} more" if len(items) > k else "")


def _header(a: Analysis) -> list[str]:
    lines = [
        f"Model: {a.model} (opset {a.opset})",
        f"Nodes: {a.total_nodes}, tagged {a.tagged_nodes} ({a.tagged_pct}%), by source: "
        + ", ".join(f"{k} {v}" for k, v in a.sources.items()),
        f"Parameters: {a.parameters:,} ({_human(a.bytes)}B), module tags: {len(a.modules)} shown",
        "Op types: " + _ops(a.op_types, 8),
    ]
    lines += [f"Note: {n}" for n in a.notes]
    if a.untagged and a.has_tags:
        lines.append(f"Untagged nodes ({len(a.untagged)}): " + ", ".join(a.untagged[:10]))
    return lines


@renderer("analyze", "summary")
def _summary(a: Analysis) -> str:
    lines = _header(a)
    if a.modules:
        top = min(s.depth for s in a.modules)
        names = ["  " * (s.depth - top) + s.tag.rsplit("/", 1)[-1] for s in a.modules]
        w = max(6, min(48, max(len(n) for n in names)))  # the tree column: as wide as the names need
        lines += ["", f"{'module':<{w}} {'nodes':>6} {'total':>6} {'params':>8}  ops (total)"]
        for name, s in zip(names, a.modules, strict=True):
            lines.append(
                f"{name:<{w}} {s.nodes:>6} {s.total_nodes:>6} {_human(s.total_parameters):>8}  {_ops(s.total_op_types, 4)}"
            )
    return "\n".join(lines) + "\n"


@renderer("analyze", "detailed")
def _detailed(a: Analysis) -> str:
    lines = _header(a) + ["", f"{'node':<40} {'op_type':<22} {'source':<11} tag"]
    lines += [
        f"{r['node']:<40} {r['op_type']:<22} {r['source'] or '-':<11} {r['tag'] or '(untagged)'}"
        for r in a.nodes
    ]
    return "\n".join(lines) + "\n"


@renderer("analyze", "json")
def _json(a: Analysis) -> str:
    return json.dumps(a.to_dict(), indent=2) + "\n"


@renderer("analyze", "csv")
def _csv(a: Analysis) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "tag",
            "module_path",
            "depth",
            "nodes",
            "total_nodes",
            "parameters",
            "total_parameters",
            "bytes",
            "total_bytes",
            "op_types",
        ]
    )
    for s in a.modules:
        ops = ";".join(f"{k}={v}" for k, v in s.op_types.items())
        writer.writerow(
            [
                s.tag,
                s.module_path or "",
                s.depth,
                s.nodes,
                s.total_nodes,
                s.parameters,
                s.total_parameters,
                s.bytes,
                s.total_bytes,
                ops,
            ]
        )
    return buf.getvalue()
