"""``profile``: ONNX Runtime's per-node timings, joined with hierarchy tags into a per-module table.

The ORT profiler knows nodes, not modules. Each ``*_kernel_time`` event names its node; the node's
tag gives the module. A module's self time is the time of its own nodes, its total time includes its
children, and its share is total time over the kernel time of the whole run. Warm-up runs are
dropped by timestamp. Nodes that ORT fused under a new name are attributed through the original node
name ORT keeps as prefix (``node/Fusion/``); what cannot be attributed is reported, never hidden.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._config import split_names
from ..errors import ConfigError
from ..hierarchy.graph import GraphIndex, ancestors_of
from ..hierarchy.tags import common_ancestor
from ..inference.pipelines import PIPELINES, pipeline
from ..metadata.schema import KEY_TASK
from ..metadata.store import read_metadata
from ..onnxfile import load_onnx, package_components
from ..runtime.session import GRAPH_LEVELS, create_session
from .formats import renderer
from .inputs import generate_inputs, load_npz_inputs, run_session
from .loading import ModelLike, TaggedModel, load_tagged_model

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnxruntime as ort

__all__ = [
    "PackageProfile",
    "ProfileConfig",
    "ModuleTiming",
    "NodeTiming",
    "ProfileResult",
    "profile",
    "profile_package",
    "aggregate_events",
    "ort_node_tags",
]

UNATTRIBUTED = "(unattributed)"
OPTIMIZED_EXTERNAL_DATA = "session.optimized_model_external_initializers_file_name"


#: Most timed (or warm-up) runs a profile may ask for: enough for stable means, bounded in time.
MAX_RUNS = 100_000


@dataclass(frozen=True)
class ProfileConfig:
    """How to run: timed runs, warm-up runs, providers, ORT graph optimization level, top-k nodes."""

    runs: int = 10
    warmup: int = 1
    providers: tuple[str, ...] = ()
    optimization: str = "basic"
    top_k: int = 10
    inputs: str | None = None

    def __post_init__(self) -> None:

        for name, low, high in (("runs", 1, MAX_RUNS), ("warmup", 0, MAX_RUNS), ("top_k", 1, 1_000_000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} must be an integer in [{low}, {high:,}], got {value!r}")
        if self.optimization not in GRAPH_LEVELS:
            raise ConfigError(
                f"optimization must be one of {', '.join(GRAPH_LEVELS)}, got {self.optimization!r}"
            )
        if isinstance(self.providers, str):
            object.__setattr__(self, "providers", split_names(self.providers))


@dataclass
class ModuleTiming:
    tag: str
    depth: int
    self_us: float = 0.0
    total_us: float = 0.0
    share: float = 0.0
    nodes: int = 0
    total_nodes: int = 0


@dataclass
class NodeTiming:
    node: str
    op_type: str
    tag: str
    us: float
    share: float


@dataclass
class ProfileResult:
    """Mean microseconds per run, per module and per node."""

    model: str
    runs: int
    provider: str
    kernel_us: float
    wall_us: float
    modules: list[ModuleTiming]
    top_nodes: list[NodeTiming]
    unattributed: dict[str, float] = field(default_factory=dict)
    #: Nodes ONNX Runtime created (fusions, folded constants), attributed through their tensors.
    ort_created: list[str] = field(default_factory=list)
    #: Mean microseconds per run of every timed node of the model's own graph (node key -> us).
    node_us: dict[str, float] = field(default_factory=dict)
    #: How it ran: optimization level, warm-up runs, intra-op threads, input shapes.
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _event_node(event: dict[str, Any]) -> str | None:
    if event.get("cat") != "Node":
        return None
    name = (event.get("args") or {}).get("node_name")
    if name:
        return name
    raw = event.get("name", "")
    return raw[: -len("_kernel_time")] if raw.endswith("_kernel_time") else None


def _timed_window(events: list[dict[str, Any]], warmup: int) -> float:
    """Timestamp after which the timed runs start (end of the last warm-up ``model_run``)."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if warmup and len(runs) >= warmup:
        last = runs[warmup - 1]
        return float(last["ts"] + last["dur"])
    return float("-inf")


def aggregate_events(
    events: list[dict[str, Any]], node_tags: dict[str, str | None], warmup: int = 0
) -> tuple[dict[str, float], dict[str, float], float]:
    """Sum kernel time per graph node (and per unattributed ORT node) after the warm-up runs."""
    start = _timed_window(events, warmup)
    per_node: dict[str, float] = defaultdict(float)
    unknown: dict[str, float] = defaultdict(float)
    wall = sum(e["dur"] for e in events if e.get("name") == "model_run" and e["ts"] >= start)
    for e in events:
        name = _event_node(e)
        if name is None or e.get("ts", 0) < start:
            continue
        base = name if name in node_tags else name.split("/", 1)[0]
        (per_node if base in node_tags else unknown)[base if base in node_tags else name] += float(
            e.get("dur", 0)
        )
    return dict(per_node), dict(unknown), float(wall)


def _modules(own: dict[str, float], kernel: float, node_counts: dict[str, int]) -> list[ModuleTiming]:
    """Self time per tag (``own``) rolled up into totals for every ancestor."""
    out: dict[str, ModuleTiming] = {}
    for tag in sorted({a for t in node_counts if t != UNATTRIBUTED for a in ancestors_of(t)}):
        out[tag] = ModuleTiming(tag, len(ancestors_of(tag)))
    for tag, n in node_counts.items():
        for anc in ancestors_of(tag) if tag != UNATTRIBUTED else []:
            out[anc].total_us += own.get(tag, 0.0)
            out[anc].total_nodes += n
        if tag in out:
            out[tag].self_us, out[tag].nodes = own.get(tag, 0.0), n
    for m in out.values():
        m.share = m.total_us / kernel if kernel else 0.0
    return list(out.values())


def ort_node_tags(optimized: onnx.ModelProto, index: GraphIndex) -> dict[str, tuple[str, str]]:
    """ORT-created node name -> (tag, op type), through the original tensors it writes or reads.

    A fused node writes the tensor its last original node wrote (SkipLayerNormalization writes the
    LayerNorm's output), so that tensor's producer names the module; failing that, the common
    ancestor of the modules that produced its inputs.
    """

    known = set(index.keys)
    out: dict[str, tuple[str, str]] = {}
    for node in optimized.graph.node:
        if not node.name or node.name in known:
            continue
        producers = [index.producer[t] for t in node.output if t in index.producer]
        if not producers:
            producers = [index.producer[t] for t in node.input if t in index.producer]
        tag = common_ancestor({index.tags[i] for i in producers if index.tags[i]})
        if tag:
            out[node.name] = (tag, node.op_type)
    return out


def _settings(cfg: ProfileConfig, sess: ort.InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, Any]:
    threads = sess.get_session_options().intra_op_num_threads
    return {
        "optimization": cfg.optimization,
        "warmup": cfg.warmup,
        "intra_op_threads": threads or "default (one per core)",
        "inputs": {k: f"{v.dtype}[{','.join(str(d) for d in v.shape)}]" for k, v in feed.items()},
    }


def _run_profiled(
    tm: TaggedModel, cfg: ProfileConfig, tmp: Path, feeds: dict[str, np.ndarray] | None = None
) -> tuple[list[dict[str, Any]], str, onnx.ModelProto | None, dict[str, Any]]:
    """Run with profiling; returns (events, provider, ORT's optimized graph or None, run settings)."""

    optimized_path = tmp / "optimized.onnx"
    sess, info = create_session(
        tm.path or tm.proto,  # from the file: ORT maps external data itself, nothing is re-serialized
        providers=cfg.providers,
        # ORT's optimized copy (read for attribution) keeps its weights out of the protobuf too
        config_entries={OPTIMIZED_EXTERNAL_DATA: "optimized.onnx.data"},
        enable_profiling=True,
        profile_file_prefix=str(tmp / "ort"),
        graph_optimization_level=cfg.optimization,
        optimized_model_filepath=str(optimized_path) if cfg.optimization != "disable" else None,
        log_severity_level=4,  # failures come back as exceptions (one-line InferenceError)
    )
    if feeds is not None:
        feed = feeds
    elif cfg.inputs:
        feed = load_npz_inputs(cfg.inputs, sess)
    else:
        feed = generate_inputs(sess, tm.sidecar, model=tm.proto)
    for _ in range(cfg.warmup + cfg.runs):
        run_session(sess, feed)
    events = json.loads(Path(sess.end_profiling()).read_text(encoding="utf-8"))
    try:
        optimized = load_onnx(optimized_path, weights=False) if optimized_path.is_file() else None
    except (OSError, ValueError, IndexError):  # attribution then falls back to node names only
        optimized = None
    return events, info.provider, optimized, _settings(cfg, sess, feed)


def profile(
    model: ModelLike,
    config: ProfileConfig | None = None,
    *,
    feeds: dict[str, np.ndarray] | None = None,
    **options: object,
) -> ProfileResult:
    """Profile ``model`` with ONNX Runtime and attribute the time to modules; ``feeds`` are its inputs (default:
    ``config.inputs``, else generated)."""
    cfg = config or ProfileConfig(**options)
    tm = load_tagged_model(model, weights=False)  # structure for the tags; ORT reads the weights
    index = tm.index
    with tempfile.TemporaryDirectory(prefix="modelexport-profile-") as tmp:
        events, provider, optimized, settings = _run_profiled(tm, cfg, Path(tmp), feeds)
    tags = dict(zip(index.keys, index.tags, strict=True))
    per_node, unknown, wall = aggregate_events(events, tags, cfg.warmup)
    created = ort_node_tags(optimized, index) if optimized is not None else {}
    rows = [
        (k, index.op_types[i], tags[k] or UNATTRIBUTED, us)
        for i, k in enumerate(index.keys)
        if (us := per_node.get(k))
    ]
    rows += [(k, created[k][1], created[k][0], us) for k, us in unknown.items() if k in created]
    rows = [(k, op, tag, us / cfg.runs) for k, op, tag, us in rows]
    left = {k: us / cfg.runs for k, us in unknown.items() if k not in created}
    kernel = sum(r[3] for r in rows) + sum(left.values())
    own: dict[str, float] = defaultdict(float)
    for _, _, tag, us in rows:
        own[tag] += us
    counts: dict[str, int] = defaultdict(int)
    for t in index.tags:
        counts[t or UNATTRIBUTED] += 1
    top = sorted(rows, key=lambda r: -r[3])[: cfg.top_k]
    return ProfileResult(
        tm.name,
        cfg.runs,
        provider,
        kernel,
        wall / cfg.runs,
        _modules(own, kernel, dict(counts)),
        [NodeTiming(k, op, tag, us, us / kernel if kernel else 0.0) for k, op, tag, us in top],
        left,
        sorted(k for k in unknown if k in created),
        {k: us for k, _, _, us in rows if k not in created},
        settings,
    )


@dataclass
class PackageProfile:
    """A multi-graph package's profile: one :class:`ProfileResult` per graph, by role, in the order they run."""

    folder: str
    components: dict[str, ProfileResult]
    #: What the graphs ran on: the package pipeline's own inputs (a synthetic image and prompt), or generated.
    inputs: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "inputs": self.inputs,
            "components": {role: r.to_dict() for role, r in self.components.items()},
        }


def _package_feeds(entry: Path) -> dict[str, dict[str, Any]]:
    """Each graph's inputs as the package's pipeline feeds them, where it offers them (``component_feeds``:
    consistent inputs such as an image grid and its patches, which generated ones cannot be); else ``{}``."""
    task = read_metadata(entry).get(KEY_TASK)
    cls = PIPELINES.find(str(task)) if task else None
    if cls is None or not callable(getattr(cls, "component_feeds", None)):
        return {}
    return pipeline(task, entry).component_feeds()


def profile_package(
    folder: str | os.PathLike[str], config: ProfileConfig | None = None, **options: object
) -> PackageProfile:
    """Profile every graph of a multi-graph package (the set its folder deploys)."""
    cfg = config or ProfileConfig(**options)
    if cfg.inputs:
        raise ConfigError(
            "--inputs gives one graph's arrays; a package of several graphs runs on its pipeline's inputs",
            hint="profile one graph file of the package with --inputs, or the folder without it",
        )
    graphs = package_components(folder)
    if not graphs:
        raise ConfigError(f"{folder} is not a package of several graphs", hint="profile its model file")
    feeds = _package_feeds(next(iter(graphs.values())))
    results = {role: profile(path, cfg, feeds=feeds.get(role)) for role, path in graphs.items()}
    return PackageProfile(str(folder), results, "the package pipeline's inputs" if feeds else "generated")


@renderer("profile_package", "text")
def _package_text(r: PackageProfile) -> str:
    total = sum(c.wall_us for c in r.components.values())
    lines = [
        f"{r.folder}: {len(r.components)} graphs on {r.inputs}; {total / 1000:.3f} ms wall per run of each",
        "",
    ]
    for role, result in r.components.items():
        lines += [f"== {role}: {Path(result.model).name} ==", _text(result)]
    return "\n".join(lines)


@renderer("profile_package", "json")
def _package_json(r: PackageProfile) -> str:
    return json.dumps(r.to_dict(), indent=2) + "\n"


@renderer("profile", "text")
def _text(r: ProfileResult) -> str:
    lines = [
        f"{r.model}: {r.runs} run(s) on {r.provider}; mean per run: {r.wall_us / 1000:.3f} ms wall, {r.kernel_us / 1000:.3f} ms in kernels",
        "",
        f"{'module':<60} {'self ms':>9} {'total ms':>9} {'share':>7} {'nodes':>6}",
    ]
    top = min((m.depth for m in r.modules), default=1)
    for m in r.modules:
        name = "  " * (m.depth - top) + m.tag.rsplit("/", 1)[-1]
        lines.append(
            f"{name:<60} {m.self_us / 1000:>9.3f} {m.total_us / 1000:>9.3f} {100 * m.share:>6.1f}% {m.total_nodes:>6}"
        )
    if r.unattributed:
        lines.append(
            f"{UNATTRIBUTED:<60} {sum(r.unattributed.values()) / 1000:>9.3f}  ({len(r.unattributed)} ORT nodes without a graph node)"
        )
    lines += ["", f"Top {len(r.top_nodes)} nodes:"]
    lines += [
        f"  {n.us / 1000:>8.3f} ms {100 * n.share:>5.1f}%  {n.op_type:<20} {n.node}  {n.tag}"
        for n in r.top_nodes
    ]
    return "\n".join(lines) + "\n"


@renderer("profile", "json")
def _json(r: ProfileResult) -> str:
    return json.dumps(r.to_dict(), indent=2) + "\n"
