"""What the training pipeline shows: the configuration summary at start and the final report.

The final report is one JSON document whose sections and keys are fixed (``REPORT_KEYS``), so
scripts can rely on them; the console table shows the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["REPORT_KEYS", "check_report", "config_table", "report_table", "format_value"]

#: Section -> its keys, exactly as issue 7 specifies them (``config`` holds the resolved options).
REPORT_KEYS: dict[str, tuple[str, ...]] = {
    "config": (),
    "training": ("train_accuracy", "val_accuracy", "epochs_run", "seconds"),
    "export": ("path", "parity_max_abs_diff", "hierarchy_coverage"),
    "quantization": ("mode", "size_bytes_fp32", "size_bytes_quantized", "val_accuracy_quantized"),
    "inference": ("provider", "latency_ms_p50", "latency_ms_p95", "throughput_per_s"),
    "test_time": ("policy", "val_accuracy_plain", "val_accuracy_with_policy", "latency_ms_with_policy"),
}


def check_report(report: dict[str, Any]) -> dict[str, Any]:
    """Raise ``ValueError`` unless ``report`` has exactly the sections and keys of :data:`REPORT_KEYS`."""
    if set(report) != set(REPORT_KEYS):
        raise ValueError(f"report sections {sorted(report)} differ from {sorted(REPORT_KEYS)}")
    for section, keys in REPORT_KEYS.items():
        if keys and set(report[section]) != set(keys):
            raise ValueError(
                f"report section {section!r} has keys {sorted(report[section])}, expected {sorted(keys)}"
            )
    return report


def format_value(value: Any) -> str:
    """Numbers as people read them: accuracies with 4 digits, sizes with units, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value and abs(value) < 1e-3:
            return f"{value:.2e}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,} ({value / 1e6:.2f} MB)" if value >= 1_000_000 else f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _table(title: str, rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value if isinstance(value, str) else format_value(value))
    return table


def config_table(rows: dict[str, Any]) -> Table:
    """The configuration summary printed before any work starts."""
    return _table("Pipeline configuration", rows.items())


def report_table(report: dict[str, Any], policy_label: str | None = None) -> Table:
    """The final report as one two-column table, grouped by section."""
    rows: list[tuple[str, Any]] = []
    for section, keys in REPORT_KEYS.items():
        if not keys:
            continue
        for key in keys:
            value = report[section][key]
            if section == "test_time" and key == "policy":
                value = policy_label or value
            rows.append((f"{section}.{key}", value))
    return _table("Pipeline report", rows)


def print_table(table: Table, console: Console | None = None) -> None:
    (console or Console()).print(table)
