"""``report``: one self-contained HTML page to see where a model's nodes, weights, time and error are.

The page data comes from the inspect commands themselves (``analyze`` for the module tree, ``extract``'s
boundary for what a module cut would take and give, ``profile`` for time, ``compare`` and the quantizer's
``module_error_report`` for differences); this module only gathers them into one JSON document and inlines
it, with the page's own script and styles (plain DOM and SVG, no third-party code), into one HTML file
that works from ``file://`` with no network access.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .._io import write_text
from .._version import __version__
from ..errors import ConfigError
from ..inference.feeds import SampleSet
from ..onnxfile import package_components, plan_output
from ..optimize.evaluate import module_error_report
from ..runtime.session import create_session
from .analyze import Analysis, analyze_model
from .compare import compare_models, module_numeric_diff, numeric_diff
from .extract import module_boundary
from .inputs import generate_inputs, load_npz_inputs
from .loading import ModelLike, TaggedModel, load_tagged_model
from .profile import ProfileConfig, profile, profile_package

__all__ = ["REPORT_FILE", "ReportConfig", "build_report_data", "render_report", "write_report"]

#: The page ``report -o DIR/`` writes in the folder.
REPORT_FILE = "report.html"
_ASSETS = "report_assets"
#: Generated input batches the error report runs when no ``inputs`` file is given.
_ERROR_SAMPLES = 4


@dataclass(frozen=True)
class ReportConfig:
    """What the page shows beyond the module tree: time, a second model, quantization error."""

    profile: ProfileConfig | None = None
    compare: str | None = None
    numeric: bool = False
    error_report: bool = False
    inputs: str | None = None
    title: str | None = None

    def __post_init__(self) -> None:
        if (self.numeric or self.error_report) and not self.compare:
            raise ConfigError(
                "--numeric and --error-report compare two models; give the other one with --compare OTHER.onnx"
            )


def _call_counts(tm: TaggedModel) -> dict[str, int]:
    sidecar = tm.sidecar or {}
    modules, paths = sidecar.get("modules", {}), sidecar.get("tags", {})
    return {
        tag: int(modules.get(path, {}).get("call_count") or 1)
        for tag, path in paths.items()
        if path is not None
    }


def _modules(tm: TaggedModel, a: Analysis) -> list[dict[str, Any]]:
    """The module tree in tree order: analyze's statistics, call counts and the extract boundary."""
    calls = _call_counts(tm)
    out = []
    for s in a.modules:
        row = asdict(s)
        row["parent"] = s.tag.rsplit("/", 1)[0] or None
        row["name"] = s.tag.rsplit("/", 1)[-1]
        row["calls"] = calls.get(s.tag, 1)
        row["boundary"] = module_boundary(tm.proto, tm.index, s.tag)
        out.append(row)
    return out


def _own_nodes(tm: TaggedModel) -> dict[str, list[list[str]]]:
    nodes: dict[str, list[list[str]]] = {}
    for key, op, tag in zip(tm.index.keys, tm.index.op_types, tm.index.tags, strict=True):
        nodes.setdefault(tag or "", []).append([key, op])
    return nodes


def _summary(tm: TaggedModel, a: Analysis) -> dict[str, Any]:
    return {
        "model": tm.name,
        "opset": a.opset,
        "nodes": a.total_nodes,
        "tagged_pct": a.tagged_pct,
        "parameters": a.parameters,
        "bytes": a.bytes,
        "op_types": a.op_types,
        "has_sidecar": a.has_sidecar,
        "notes": a.notes,
    }


def _feeds(tm: TaggedModel, inputs: str | None) -> list[dict[str, Any]]:
    sess, _ = create_session(tm.proto, log_severity_level=4)
    if inputs:
        return [load_npz_inputs(inputs, sess)]
    return [generate_inputs(sess, tm.sidecar, seed=s, model=tm.proto) for s in range(_ERROR_SAMPLES)]


def _comparison(tm: TaggedModel, cfg: ReportConfig) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """Per-module differences to ``cfg.compare`` (and its quantization error per module when asked)."""
    other = load_tagged_model(cfg.compare, weights=cfg.numeric or cfg.error_report)
    c = compare_models(tm, other)
    sizes_a = {s.tag: s for s in analyze_model(tm).modules}
    sizes_b = {s.tag: s for s in analyze_model(other).modules}
    rows = [
        {
            "tag": tag,
            "nodes": [
                getattr(sizes_a.get(tag), "total_nodes", 0),
                getattr(sizes_b.get(tag), "total_nodes", 0),
            ],
            "bytes": [
                getattr(sizes_a.get(tag), "total_bytes", 0),
                getattr(sizes_b.get(tag), "total_bytes", 0),
            ],
            "ops": c.module_op_deltas.get(tag, {}),
        }
        for tag in sorted(set(sizes_a) | set(sizes_b))
    ]
    data = {
        "a": asdict(c.a) | {"module_ops": None},
        "b": asdict(c.b) | {"module_ops": None},
        "identical_structure": c.identical_structure,
        "op_type_deltas": c.op_type_deltas,
        "modules_added": c.modules_added,
        "modules_removed": c.modules_removed,
        "modules": rows,
        "numeric": numeric_diff(tm, other, cfg.inputs) if cfg.numeric else None,
        "module_numeric": module_numeric_diff(tm, other, cfg.inputs) if cfg.numeric else None,
    }
    errors = None
    if cfg.error_report:
        samples = SampleSet(_feeds(tm, cfg.inputs), None, "generated" if not cfg.inputs else "npz")
        errors = module_error_report(tm.proto, other.proto, samples)
    return data, errors


def _components(model: ModelLike, cfg: ReportConfig) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A multi-graph package folder's graphs (role, file, nodes, tags, parameters, weights; time per run with
    ``--profile``) and the profile of the first one (the page's graph); ``[]`` for one graph."""
    graphs = (
        package_components(model) if isinstance(model, str | os.PathLike) and Path(model).is_dir() else {}
    )
    if not graphs:
        return [], None
    timed = profile_package(model, cfg.profile) if cfg.profile is not None else None
    rows = []
    for role, path in graphs.items():
        a = analyze_model(load_tagged_model(path, weights=False))
        row = {
            "role": role,
            "file": path.name,
            "nodes": a.total_nodes,
            "tagged_pct": a.tagged_pct,
            "parameters": a.parameters,
            "bytes": a.bytes,
        }
        if timed is not None:
            row["wall_us"] = timed.components[role].wall_us
        rows.append(row)
    first = next(iter(timed.components.values())).to_dict() | {"node_us": None} if timed else None
    return rows, first


def build_report_data(model: ModelLike, config: ReportConfig | None = None) -> dict[str, Any]:
    """Everything the page shows, as one JSON-ready document (also useful on its own). A multi-graph package
    folder gets the page of the graph it runs first, with every graph of the package in ``components``."""
    cfg = config or ReportConfig()
    needs_weights = cfg.profile is not None or cfg.numeric or cfg.error_report
    components, component_profile = _components(model, cfg)
    tm = load_tagged_model(model, weights=needs_weights)
    analysis = analyze_model(tm)
    data: dict[str, Any] = {
        "title": cfg.title or f"modelexport report: {Path(tm.name).name}",
        "generator": f"modelexport {__version__}",
        "summary": _summary(tm, analysis),
        "modules": _modules(tm, analysis),
        "nodes": _own_nodes(tm),
        "profile": component_profile,
        "compare": None,
        "error_report": None,
        "components": components,
    }
    if cfg.profile is not None and component_profile is None:
        result = profile(tm.proto if tm.path is None else tm.path, cfg.profile)
        data["profile"] = result.to_dict() | {"node_us": None}
    if cfg.compare:
        data["compare"], data["error_report"] = _comparison(tm, cfg)
    return data


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(_ASSETS, name).read_text(encoding="utf-8")


def _finite(value: object) -> object:
    """JSON has no infinities (``numeric`` reports an infinite error for outputs of different shapes)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _embed_json(data: dict[str, Any]) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can appear)."""
    text = json.dumps(_finite(data), default=str, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_report(data: dict[str, Any]) -> str:
    """The HTML page: template with the styles, the script and the data inlined."""
    import html

    page = _asset("report.html")
    for key, value in (
        ("{{TITLE}}", html.escape(data["title"])),
        ("{{STYLE}}", _asset("report.css")),
        ("{{DATA}}", _embed_json(data)),
        ("{{SCRIPT}}", _asset("report.js")),
    ):
        page = page.replace(key, value)
    return page


def write_report(
    model: ModelLike,
    output: str | os.PathLike[str],
    config: ReportConfig | None = None,
    *,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Build the data, render the page and write it atomically; returns (path, data).

    ``output`` follows the one output rule (:mod:`modelexport.onnxfile.output`): ``PAGE.html``, or a folder
    that gets ``report.html``; checked before any work, never over an input, nor over an existing file
    without ``overwrite``.
    """
    cfg = config or ReportConfig()
    sources = [model if isinstance(model, str | os.PathLike) else None, cfg.compare, cfg.inputs]
    plan = plan_output(output, REPORT_FILE, inputs=sources, overwrite=overwrite)
    if plan.path.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"the report is an HTML page; give an output ending in .html, got {output}")
    data = build_report_data(model, config)
    return write_text(plan.path, render_report(data)), data
