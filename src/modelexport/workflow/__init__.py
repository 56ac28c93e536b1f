"""The end-to-end pipeline: data -> DSPy training -> export -> quantize -> test-time policy -> report.

It composes every layer below it (``train`` for the DSPy program and optimizers, ``export``,
``optimize``, ``testtime``) and is what ``modelexport pipeline`` and ``pipeline.py`` run.
"""

from __future__ import annotations

from .config import LOG_LEVELS, REPORT_NAME, PipelineConfig, PipelineResult
from .run import PipelineRun, run_pipeline

__all__ = ["LOG_LEVELS", "REPORT_NAME", "PipelineConfig", "PipelineResult", "PipelineRun", "run_pipeline"]
