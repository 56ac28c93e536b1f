"""``batch_infer``: score a whole dataset with an exported model, in one process or on a Ray cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._config import split_names
from .._progress import progress_bar
from ..errors import ConfigError
from ..inference.pipelines import PIPELINES
from ..inference.pipelines.factory import resolve_task
from ..metadata.store import read_metadata
from ..onnxfile import plan_output, resolve_model_path
from ..testtime.policy import TestTimePolicy
from .config import BatchConfig, output_format
from .engines import ENGINES, require_ray
from .sink import ResultSink
from .source import read_rows, require_pyarrow
from .worker import WorkerSpec

__all__ = ["batch_infer", "BatchResult"]

#: The file ``--output DIR/`` writes in the folder.
PREDICTIONS_FILE = "predictions.parquet"
#: Input kind -> the processor kind a task's pipeline must accept for it.
_PROCESSOR_FOR = {"text": "tokenizer", "image": "image_processor"}


@dataclass(frozen=True)
class BatchResult:
    """What a run wrote: rows (each input row once), failed rows, time and throughput."""

    output: str
    model: str
    task: str
    rows: int
    errors: int
    seconds: float
    rows_per_s: float
    columns: list[str]
    config: dict[str, Any]
    error_examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _task(model_file: Path, task: str | None, kind: str) -> str:
    """The pipeline task, refused up front when it cannot take this kind of input."""
    name = resolve_task(task, read_metadata(model_file), model_file)
    if kind == "feeds":
        if not PIPELINES[name].takes_feeds:
            raise ConfigError(
                f"the model's task is {name}; its outputs need the raw inputs, not a .npz of model-ready arrays",
                hint="pass the raw inputs (a CSV of texts, an image folder)",
            )
        return name
    wanted = _PROCESSOR_FOR[kind]
    if wanted not in PIPELINES[name].processor_kinds:
        raise ConfigError(
            f"the model's task is {name}; it does not take {kind} inputs",
            hint="check --data (texts for text models, images for image models) or pass --task",
        )
    return name


def batch_infer(
    model: str | os.PathLike[str],
    data: str | os.PathLike[str] | Sequence[str],
    output: str | os.PathLike[str],
    engine: str = "local",
    *,
    num_workers: int = 1,
    threads_per_worker: int = 1,
    batch_size: int = 32,
    address: str | None = None,
    keep_columns: Sequence[str] | str = (),
    task: str | None = None,
    input_column: str | None = None,
    providers: Sequence[str] | str | None = None,
    call_kwargs: dict[str, Any] | None = None,
    test_time_policy: TestTimePolicy | dict[str, Any] | bool | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> BatchResult:
    """Predict every row of ``data`` (CSV/TSV/JSON/JSONL/Parquet/.txt, an image folder, a list of texts
    or image paths, or a ``.npz`` of model-ready arrays: ``x`` or one per graph input, rows on axis 0,
    which skip the processor) and write ``output`` (``.parquet`` or ``.jsonl``): ``id`` (the row's index in the
    input), the kept columns, the task pipeline's prediction fields and ``error`` (null unless the row
    failed). ``engine="ray"`` runs ``num_workers`` actors of ``threads_per_worker`` ONNX Runtime threads
    each, on the cluster at ``address`` or a local one. ``output`` follows the one output rule
    (:mod:`modelexport.onnxfile.output`): a folder gets ``predictions.parquet``; never the model or the
    data, never over an existing file without ``overwrite``.
    """
    config = BatchConfig(
        engine, num_workers, threads_per_worker, batch_size, address, tuple(split_names(keep_columns))
    )
    sources = [data] if isinstance(data, str | os.PathLike) else []
    output = plan_output(output, PREDICTIONS_FILE, inputs=[model, *sources], overwrite=overwrite).path
    output_format(output)
    require_pyarrow()
    if config.engine == "ray":
        require_ray()
    model_file = resolve_model_path(model).resolve()
    rows = read_rows(data, config.keep_columns, input_column, model_file)
    name = _task(model_file, task, rows.kind)
    spec = WorkerSpec(
        model=str(model_file),
        kind=rows.kind,
        task=name,
        threads=config.threads_per_worker,
        batch_size=config.batch_size,
        providers=split_names(providers),
        keep_columns=config.keep_columns,
        call_kwargs=dict(call_kwargs or {}),
        test_time_policy=test_time_policy,
    )

    start = time.perf_counter()
    with (
        ResultSink(output, len(rows), config.keep_columns) as sink,
        progress_bar(
            total=len(rows), unit="row", disable=not progress, desc=f"infer ({config.engine})"
        ) as bar,
    ):
        for table in ENGINES[config.engine](rows, spec, config):
            sink.add(table)
            bar.update(table.num_rows)
        summary = sink.finish()
    seconds = time.perf_counter() - start
    return BatchResult(
        output=str(output),
        model=str(model_file),
        task=name,
        rows=summary.rows,
        errors=summary.errors,
        seconds=round(seconds, 3),
        rows_per_s=round(summary.rows / seconds, 2),
        columns=summary.columns,
        config=config.to_dict(),
        error_examples=summary.error_examples,
    )
