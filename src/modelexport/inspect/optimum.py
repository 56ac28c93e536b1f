"""Check that an output folder is what Hugging Face Optimum expects, by loading it with the real Optimum."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelExportError
from ..inference.processors import ONNXAutoProcessor
from ..metadata.schema import KEY_TASK
from ..metadata.store import read_metadata
from ..metadata.tasks import get_task

__all__ = ["OptimumCompatibility", "validate_optimum_compatibility"]


@dataclass
class OptimumCompatibility:
    """Result of the checks: ``ok`` when no finding is an error; ``checks`` says what passed."""

    output_dir: Path
    task: str | None = None
    ort_model_class: str | None = None
    checks: dict[str, bool] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    processor: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def fail(self, check: str, finding: str) -> None:
        self.checks[check] = False
        self.findings.append(finding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_dir": str(self.output_dir),
            "ok": self.ok,
            "task": self.task,
            "ort_model_class": self.ort_model_class,
            "checks": self.checks,
            "findings": self.findings,
            "processor": self.processor,
        }


def _check_files(report: OptimumCompatibility) -> bool:
    d = report.output_dir
    for name in ("model.onnx", "config.json"):
        present = (d / name).is_file()
        report.checks[f"file:{name}"] = present
        if not present:
            report.findings.append(f"{name} is missing from {d}")
    return report.checks["file:model.onnx"] and report.checks["file:config.json"]


def _check_config(report: OptimumCompatibility) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(report.output_dir), local_files_only=True)
        report.checks["config_loadable"] = True
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        report.fail("config_loadable", f"config.json does not load with AutoConfig: {exc}")


def _check_task(report: OptimumCompatibility) -> None:
    try:
        meta = read_metadata(report.output_dir / "model.onnx")
    except ModelExportError as exc:
        report.fail("metadata", f"embedded metadata unreadable: {exc}")
        return
    report.task = meta.get(KEY_TASK)
    if not report.task:
        report.fail("task", "no task in the embedded metadata (re-export with --task)")
        return
    report.ort_model_class = get_task(report.task).ort_model_class
    if report.ort_model_class is None:
        report.fail("task", f"Optimum has no ORTModel class for task {report.task!r}")


def _check_ort_model(report: OptimumCompatibility) -> None:
    try:
        import optimum.onnxruntime as ort_optimum
    except ImportError as exc:
        report.fail(
            "ort_model_loads",
            f"optimum-onnx is not installed ({exc}); it needs transformers 4.57: in an environment with"
            " transformers<4.58, pip install 'modelexport[optimum]' (make test-compat builds one)",
        )
        return
    cls = getattr(ort_optimum, str(report.ort_model_class), None)
    if cls is None:
        report.fail("ort_model_loads", f"this Optimum has no {report.ort_model_class}")
        return
    try:
        cls.from_pretrained(str(report.output_dir))
        report.checks["ort_model_loads"] = True
    except Exception as exc:  # noqa: BLE001 - any failure is the finding we report
        report.fail(
            "ort_model_loads", f"{report.ort_model_class}.from_pretrained failed: {type(exc).__name__}: {exc}"
        )


def _check_processor(report: OptimumCompatibility) -> None:

    try:
        proc = ONNXAutoProcessor.from_model(report.output_dir)
        report.processor = proc.describe()
        report.checks["processor_detected"] = True
    except ModelExportError as exc:
        report.fail("processor_detected", f"no processor detected: {exc}")


def validate_optimum_compatibility(output_dir: str | Path) -> OptimumCompatibility:
    """Files present, config loadable, the task's ORTModel class loads the folder, processor shapes detected."""
    report = OptimumCompatibility(Path(output_dir))
    if not report.output_dir.is_dir():
        report.fail("folder", f"{report.output_dir} is not a folder")
        return report
    if not _check_files(report):
        return report
    _check_config(report)
    _check_task(report)
    if report.ort_model_class:
        _check_ort_model(report)
    _check_processor(report)
    return report
