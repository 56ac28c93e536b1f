"""Engines: how the batches of a run reach workers. Both yield output batches to the driver's sink.

``local`` runs one :class:`Predictor` in this process. ``ray`` runs ``num_workers`` of them as Ray Data
actors (``map_batches`` with an ``ActorPoolStrategy``), each reserving ``threads_per_worker`` CPUs:
actors are restarted and their tasks retried when a worker dies (a retried batch is recomputed whole, its
output only ever returned once), so every row comes back exactly once -- the sink checks it by ``id``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._stages import announce
from ..errors import ConfigError
from .config import BatchConfig
from .source import Rows
from .worker import Predictor, WorkerSpec

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ENGINES", "run_local", "run_ray", "require_ray", "ray_cluster", "map_actors", "FAULT_TOLERANCE"]

log = logging.getLogger(__name__)

#: Actor options for a run that loses nothing: restart a dead actor without limit and retry its tasks.
FAULT_TOLERANCE = {"max_restarts": -1, "max_task_retries": -1}
#: Blocks per worker Ray Data schedules (more: finer balancing and cheaper retries; fewer: less overhead).
_BLOCKS_PER_WORKER = 8


def run_local(rows: Rows, spec: WorkerSpec, config: BatchConfig) -> Iterator[Any]:
    """One predictor in this process, ``batch_size`` rows at a time."""
    predictor = Predictor(spec)
    for start in range(0, len(rows), config.batch_size):
        yield predictor(rows.table.slice(start, config.batch_size))


def require_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "engine 'ray' needs Ray Data, which is not installed",
            hint="pip install 'modelexport[distributed]'",
        ) from exc
    return ray


def _package_root() -> str:
    """The folder this modelexport is imported from: local workers import the same code as the driver."""
    return str(Path(__file__).resolve().parents[2])


def _ray_log_level() -> int:
    """Ray's and Ray Data's own lines (cluster start, execution plans) only where the application's logging
    asks for them: at least WARNING, and what the root logger is set to (the CLI: ERROR unless --debug)."""
    return max(logging.getLogger().getEffectiveLevel(), logging.WARNING)


@contextlib.contextmanager
def ray_cluster(config: BatchConfig) -> Iterator[Any]:
    """Join ``config.address``, reuse a running connection, or start a local cluster sized to the workers
    (stopped afterwards)."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"log_to_driver": False, "logging_level": _ray_log_level()}
    announce(f"connecting to Ray at {config.address}" if config.address else "starting a local Ray cluster")
    if config.address:
        ray.init(address=config.address, **quiet)
    else:
        paths = [_package_root(), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {"PYTHONPATH": os.pathsep.join(paths), "TOKENIZERS_PARALLELISM": "false"}
        ray.init(
            num_cpus=config.num_workers * config.threads_per_worker,
            include_dashboard=False,
            runtime_env={"env_vars": env},
            **quiet,
        )
    try:
        yield ray
    finally:
        ray.shutdown()


def _blocks(table: pa.Table, config: BatchConfig) -> list[pa.Table]:
    """The rows cut into blocks (whole batches) for Ray Data; made here, so no shuffle task competes with
    the actors for CPUs (on a cluster sized to the actors, it would wait forever)."""
    per_block = math.ceil(table.num_rows / (config.num_workers * _BLOCKS_PER_WORKER))
    per_block = max(1, math.ceil(per_block / config.batch_size)) * config.batch_size
    return [table.slice(s, per_block) for s in range(0, table.num_rows, per_block)]


def map_actors(
    table: pa.Table, worker: type, args: tuple[object, ...], config: BatchConfig
) -> Iterator[pa.Table]:
    """``config.num_workers`` actors of ``worker(*args)`` (each built once, restarted if it dies) called on
    ``config.batch_size`` rows of ``table`` at a time; their output batches in input order."""
    with ray_cluster(config) as ray:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(_ray_log_level())  # its own console handler logs INFO
        dataset = ray.data.from_arrow(_blocks(table, config))
        announce(f"{config.num_workers} Ray actor(s) loading the model and scoring")
        with warnings.catch_warnings():  # Ray >= 2.5x names these args deprecated; they are its defaults
            warnings.filterwarnings("ignore", message=".*ray_remote_args.*")
            predicted = dataset.map_batches(
                worker,
                fn_constructor_args=args,
                batch_size=config.batch_size,
                batch_format="pyarrow",
                zero_copy_batch=True,
                compute=ray.data.ActorPoolStrategy(size=config.num_workers),
                num_cpus=config.threads_per_worker,
                **FAULT_TOLERANCE,
            )
        yield from predicted.iter_batches(batch_size=None, batch_format="pyarrow")


def run_ray(rows: Rows, spec: WorkerSpec, config: BatchConfig) -> Iterator[Any]:
    """``num_workers`` predictor actors over the rows; output batches in input order."""
    yield from map_actors(rows.table, Predictor, (spec,), config)


#: Engine name -> run(rows, worker spec, config) yielding output batches.
ENGINES: dict[str, Callable[[Rows, WorkerSpec, BatchConfig], Iterator[Any]]] = {
    "local": run_local,
    "ray": run_ray,
}
