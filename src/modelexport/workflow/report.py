"""What the training pipeline shows: the configuration summary at start and the final report.

The final report is one JSON document whose sections and keys are fixed (``REPORT_KEYS``), so
scripts can rely on them; the console table shows the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from ..data import Dataset
    from ..train.policy_search import PolicyTrial
    from .config import PipelineConfig

__all__ = [
    "REPORT_KEYS",
    "CHOSEN_BY_SEARCH",
    "DEFAULT_NO_SEARCH",
    "SET_BY_USER",
    "check_report",
    "config_table",
    "majority_rate",
    "majority_warning",
    "policy_settings",
    "report_table",
    "format_value",
]

#: Section -> its keys, exactly as issue 7 specifies them (``config`` holds the resolved options).
REPORT_KEYS: dict[str, tuple[str, ...]] = {
    "config": (),
    "training": (
        "train_accuracy",
        "val_accuracy",
        "epochs_run",
        "seconds",
        "majority_class_rate",
        "at_or_below_majority",
    ),
    "export": ("path", "parity_max_abs_diff", "hierarchy_coverage"),
    "quantization": ("mode", "size_bytes_fp32", "size_bytes_quantized", "val_accuracy_quantized"),
    "inference": ("provider", "latency_ms_p50", "latency_ms_p95", "throughput_per_s"),
    "test_time": (
        "policy",
        "val_accuracy_plain",
        "val_accuracy_with_policy",
        "latency_ms_with_policy",
        "settings",
    ),
}

#: Where a test-time setting's value came from (``test_time.settings[name].source`` starts with one).
SET_BY_USER = "set by user"
CHOSEN_BY_SEARCH = "chosen by search"
DEFAULT_NO_SEARCH = "default (policy search off)"


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


def majority_rate(val: Dataset) -> float:
    """The share of the most frequent class in the validation set: what always guessing it scores."""
    labels = np.asarray(val.labels)
    return float(np.bincount(labels).max() / len(labels)) if len(labels) else 0.0


def majority_warning(training: dict[str, Any]) -> str:
    """The line a run ending at or below the majority-class rate prints (and the report flags)."""
    return (
        f"validation accuracy {training['val_accuracy']:.4f} is at or below the majority-class rate "
        f"{training['majority_class_rate']:.4f}: the model does no better than always predicting the most "
        "frequent class; train longer (--epochs), raise --learning_rate, or check the labels and the data"
    )


def policy_settings(
    cfg: PipelineConfig,
    best: PolicyTrial,
    plain: PolicyTrial,
    trials: list[PolicyTrial],
    searched: bool,
    notes: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each test-time setting's value and where it came from: ``set by user``, ``chosen by search: why``, or
    the model type's default (the search off, or a value the search does not vary)."""
    policy = best.policy
    values = {
        "tta": bool(policy.tta_transforms),
        "tta_transforms": list(policy.tta_transforms) or None,
        "tta_aggregate": policy.tta_aggregate if policy.tta_transforms else None,
        "ttt": policy.ttt if policy.ttt != "none" else False,
        "ttt_iterations": policy.ttt_iterations if policy.ttt != "none" else None,
        "learning_rate": policy.learning_rate if policy.ttt in ("tent", "sar") else None,
        "mc_dropout": policy.mc_dropout,
        "ensemble": "fp32 + int8" if best.ensemble else "none",
    }
    why = (
        f"the most accurate allowed candidate within the latency budget, val acc {best.accuracy:.4f} on its "
        f"worst stream order (plain {plain.accuracy:.4f})"
    )
    out: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name in cfg.user_set:
            source = SET_BY_USER
        elif name == "learning_rate":  # not searched: the run's learning rate
            source = (
                f"the run's --learning_rate ({cfg.model_type} default)" if value is not None else "not used"
            )
        elif name == "ttt_iterations" and policy.ttt != "none":  # the method's own default
            source = (
                "default: one pass with the memory statistics"
                if value is None
                else f"default: {value} gradient step(s) per batch"
            )
        elif searched:
            on = value not in (False, None, 0, "none")
            source = f"{CHOSEN_BY_SEARCH}: {why if on else _why_off(name, trials, best, notes or [])}"
        else:
            source = DEFAULT_NO_SEARCH
        out[name] = {"value": value, "source": source}
    out["iterative"] = {  # the search's one method that needs a model input fed back from an output
        "value": None,
        "source": "not a candidate: the trained network has no input that an output feeds back to "
        "(modelexport evaluate/infer --iterate run models that have one)",
    }
    return out


_HAS: dict[str, Any] = {
    "tta": lambda p, e: bool(p.tta_transforms),
    "ttt": lambda p, e: p.ttt != "none",
    "mc_dropout": lambda p, e: bool(p.mc_dropout),
    "ensemble": lambda p, e: bool(e),
}
_HAS.update(
    tta_transforms=_HAS["tta"],
    tta_aggregate=_HAS["tta"],
    ttt_iterations=_HAS["ttt"],
    learning_rate=_HAS["ttt"],
)
#: What a skipped candidate's label names, per setting (``policy_search._label``).
_LABEL = {"tta": "tta[", "ttt": ("bn", "tent", "sar"), "mc_dropout": "mc_dropout", "ensemble": "ensemble["}


def _why_off(name: str, trials: list[PolicyTrial], best: PolicyTrial, notes: list[str]) -> str:
    """Why the search left a setting off: its best candidate and what beat it, or why none ran."""
    tried = [t for t in trials if _HAS[name](t.policy, t.ensemble)]
    if not tried:
        key = {"tta_transforms": "tta", "tta_aggregate": "tta", "ttt_iterations": "ttt"}.get(name, name)
        marks = _LABEL.get(key, ())
        skipped = [
            n
            for n in notes
            if any(m in n.split(":")[0] for m in ((marks,) if isinstance(marks, str) else marks))
        ]
        if skipped:
            return f"off, its candidate could not run ({skipped[0][:160]})"
        return "off, not a candidate here (the model or the options rule it out)"
    top = max(tried, key=lambda t: (t.accuracy, -t.latency_ms))
    if not top.safe:
        reason = "worse than plain on a stream order"
    elif not top.within_budget:
        reason = "over the latency budget"
    else:
        reason = f"not more accurate than the chosen {best.accuracy:.4f} (ties go to the faster)"
    return f"off, its best candidate scored {top.accuracy:.4f}: {reason}"


def format_value(value: object) -> str:
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
            if section == "test_time" and key == "settings":
                rows += [
                    (f"test_time.{n}", f"{format_value(e['value'])} ({e['source']})")
                    for n, e in value.items()
                ]
                continue
            rows.append((f"{section}.{key}", value))
    return _table("Pipeline report", rows)


def print_table(table: Table, console: Console | None = None) -> None:
    (console or Console()).print(table)
