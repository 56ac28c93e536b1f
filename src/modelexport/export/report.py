"""``export_report.md``: each stage with status and time, node count, coverage, parity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .result import ExportResult

__all__ = ["render_export_report"]


def render_export_report(result: ExportResult, model_info: dict[str, Any]) -> str:
    cov = result.coverage
    lines = [
        f"# Export report: {model_info['class']}",
        "",
        f"- Source: `{model_info.get('name_or_path') or model_info['qualified_class']}` ({model_info['source']})",
        f"- Parameters: {model_info['parameters']:,}",
        f"- Exporter: {result.exporter}, opset {result.opset}",
        f"- Nodes: {result.node_count}",
        f"- Tag coverage: {cov['coverage_pct']}% ({cov['tagged_nodes']}/{cov['total_nodes']}), "
        + ", ".join(f"{k}: {v}" for k, v in sorted(cov["by_source"].items())),
        f"- Unique tags: {cov['unique_tags']}",
        "- Topology vs plain torch.onnx.export: "
        + {True: "identical", False: "DIFFERENT", None: "not checked (use --verify-topology)"}[
            result.topology_identical
        ],
    ]
    if result.parity:
        diffs = ", ".join(f"`{k}` {v:.3g}" for k, v in result.parity["max_abs_diff"].items())
        lines.append(f"- Parity (ONNX Runtime vs PyTorch, atol {result.parity['atol']}): {diffs}")
    else:
        lines.append("- Parity: skipped")
    lines += ["", "## Stages", "", "| stage | status | seconds | detail |", "|---|---|---:|---|"]
    lines += [f"| {s['stage']} | {s['status']} | {s['seconds']:.3f} | {s['detail']} |" for s in result.stages]
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"
