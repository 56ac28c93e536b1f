"""``BatchConfig``: how a batch-inference run is spread (engine, workers, threads, batch size, cluster address)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._config import split_names
from ..errors import ConfigError

__all__ = ["BatchConfig", "ENGINE_NAMES", "OUTPUT_FORMATS", "output_format"]

#: Engines (see :data:`modelexport.batch.engines.ENGINES`): one process, or actors on a Ray cluster.
ENGINE_NAMES = ("local", "ray")
#: Output file suffix -> format written.
OUTPUT_FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def output_format(path: str | Path) -> str:
    """The output format chosen by the file's extension; ConfigError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ConfigError(
            f"cannot write predictions to {Path(path).name!r}: unknown extension {suffix or '(none)'}",
            hint=f"name the output {' or '.join(f'PRED{s}' for s in OUTPUT_FORMATS)}",
        )
    return OUTPUT_FORMATS[suffix]


@dataclass(frozen=True)
class BatchConfig:
    """One run's layout. ``threads_per_worker`` is each ONNX Runtime session's ``intra_op_num_threads``
    (set explicitly: ORT otherwise sizes its pool to the whole host, and N workers would oversubscribe it)."""

    engine: str = "local"
    num_workers: int = 1
    threads_per_worker: int = 1
    batch_size: int = 32
    #: Ray cluster to join (``auto``, ``ray://host:10001``); None starts a local one sized to the workers.
    address: str | None = None
    keep_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep_columns", split_names(self.keep_columns))
        if self.engine not in ENGINE_NAMES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")
        for name in ("num_workers", "threads_per_worker", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.engine == "local" and self.num_workers != 1:
            raise ConfigError(
                f"the local engine runs one worker, got num_workers={self.num_workers}",
                hint="use engine='ray' (--engine ray) to run several workers",
            )
        if self.engine == "local" and self.address:
            raise ConfigError("address names a Ray cluster; it needs engine='ray' (--engine ray)")
        reserved = {"id", "error"} & set(self.keep_columns)
        if reserved:
            raise ConfigError(
                f"keep_columns cannot include {sorted(reserved)}: the output writes them itself"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "num_workers": self.num_workers,
            "threads_per_worker": self.threads_per_worker,
            "batch_size": self.batch_size,
            "address": self.address,
            "keep_columns": list(self.keep_columns),
        }
