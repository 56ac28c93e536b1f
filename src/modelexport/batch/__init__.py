"""Batch inference over whole datasets: one process (``engine="local"``) or Ray Data actors (``engine="ray"``).

``batch_infer(model, data, output)`` reads rows (:mod:`.source`), runs them through the model's own task
pipeline in workers that each hold one ONNX Runtime session (:mod:`.worker`), and writes every input row
exactly once, failures included, to a Parquet or JSONL file staged and renamed on success (:mod:`.sink`).
Ray is optional: ``pip install 'modelexport[distributed]'``.
"""

from __future__ import annotations

from .api import BatchResult, batch_infer
from .config import ENGINE_NAMES, OUTPUT_FORMATS, BatchConfig
from .engines import ENGINES
from .evaluate import evaluate_batch
from .source import read_rows
from .worker import Predictor, WorkerSpec

__all__ = [
    "batch_infer",
    "evaluate_batch",
    "BatchResult",
    "BatchConfig",
    "ENGINE_NAMES",
    "ENGINES",
    "OUTPUT_FORMATS",
    "read_rows",
    "Predictor",
    "WorkerSpec",
]
