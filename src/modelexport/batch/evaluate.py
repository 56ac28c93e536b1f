"""``evaluate_batch``: the local evaluation's metrics (accuracy, latency p50/p95 per batch, throughput, ``n``)
measured by Ray actors, the test-time policy applied inside each.

The driver loads and orders the labelled data once and sends only example indices through Ray Data; each
actor (:class:`Evaluator`) holds one :class:`~modelexport.testtime.engine.TestTimeEngine` built once from the
model's path with ``threads_per_worker`` ONNX Runtime threads, turns its indices into a batch with the model's
own processor and measures it with the local evaluation's :class:`~modelexport.inference.evaluate.BatchMeter`.
The per-batch measurements add up on the driver with the same :func:`~modelexport.inference.evaluate.summarize`,
so accuracy and ``n`` equal ``engine="local"``'s on the same data.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ..data import Dataset
from ..errors import ConfigError, TestTimeError
from ..inference.evaluate import (
    BatchMeasure,
    BatchMeter,
    EvaluationResult,
    eval_processor,
    evaluate,
    ordered,
    prepare_batches,
    summarize,
)
from ..inference.processors import ONNXAutoProcessor
from ..onnxfile import resolve_model_path
from ..runtime.session import SessionConfig
from ..testtime.engine import TestTimeEngine
from ..testtime.policy import TestTimePolicy
from ..testtime.streams import StreamOrder, stream_order
from .config import BatchConfig
from .engines import map_actors, require_ray
from .source import ID, require_pyarrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["evaluate_batch", "Evaluator", "EvalSpec"]

_MEASURES = [f.name for f in fields(BatchMeasure)]


@dataclass(frozen=True)
class EvalSpec:
    """What an evaluation actor needs: the model's path (each actor reads it), the ordered data, the policy."""

    model: str
    dataset: Dataset
    policy: TestTimePolicy
    threads: int = 1
    providers: tuple[str, ...] = ()


class Evaluator:
    """Ray actor: a batch of example indices -> one row of that batch's measurement (plus the worker)."""

    def __init__(self, spec: EvalSpec) -> None:
        config = SessionConfig(
            providers=spec.providers, intra_op_num_threads=spec.threads, inter_op_num_threads=1
        )
        engine = TestTimeEngine(spec.model, spec.policy, spec.providers or None, session_config=config)
        self.sources = ONNXAutoProcessor.sources(spec.model)
        self.dataset = spec.dataset
        self.meter = BatchMeter(
            engine,
            eval_processor(spec.dataset.kind, self.sources, spec.dataset.source),
            spec.dataset.num_classes,
        )
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.provider = engine.session_info.provider

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa

        indices = batch.column(ID).to_pylist()
        batches = prepare_batches(self.dataset.subset(indices), self.sources, len(indices))
        measures = [self.meter.measure(*b) for b in batches]
        rows = [{**asdict(m), "worker": self.worker, "provider": self.provider} for m in measures]
        return pa.Table.from_pylist(rows)


def _measure(dataset: Dataset, spec: EvalSpec, config: BatchConfig) -> tuple[dict[str, Any], str, dict]:
    """(metrics, provider, run facts) of one policy on the cluster."""
    import pyarrow as pa

    table = pa.table({ID: pa.array(range(len(dataset)), pa.int64())})
    start = time.perf_counter()
    rows = [r for t in map_actors(table, Evaluator, (spec,), config) for r in t.to_pylist()]
    wall = time.perf_counter() - start
    measures = [BatchMeasure(**{k: r[k] for k in _MEASURES}) for r in rows]
    busy: dict[str, float] = {}
    done: dict[str, int] = {}
    for r in rows:
        busy[r["worker"]] = busy.get(r["worker"], 0.0) + r["seconds"]
        done[r["worker"]] = done.get(r["worker"], 0) + r["n"]
    # the workers run side by side: the cluster's rate is the sum of each worker's own rate
    rate = sum(done[w] / busy[w] for w in busy if busy[w] > 0)
    metrics = summarize(measures)
    metrics["throughput_per_s"] = round(rate, 2)
    facts = {
        "engine": "ray",
        "num_workers": config.num_workers,
        "threads_per_worker": config.threads_per_worker,
        "workers_seen": len(busy),
        "wall_seconds": round(wall, 3),
        "examples_per_s_wall": round(metrics["n"] / wall, 2),
    }
    return metrics, rows[0]["provider"], facts


def evaluate_batch(
    model: str | os.PathLike[str],
    data: Dataset | str | os.PathLike[str],
    policy: TestTimePolicy | None = None,
    engine: str = "ray",
    *,
    num_workers: int = 1,
    threads_per_worker: int = 1,
    batch_size: int = 64,
    address: str | None = None,
    baseline: bool = False,
    providers: Sequence[str] | None = None,
    order: str | StreamOrder = "as-is",
) -> EvaluationResult:
    """:func:`modelexport.inference.evaluate.evaluate` on ``engine`` (``local``: that function itself).

    On ``ray``, ``throughput_per_s`` is the cluster's: the sum over workers of the examples each ran per
    second of its model time (start-up excluded; ``extra`` has the wall-clock rate). Continual adaptation
    (``policy.continual``) is refused: its one stream of batches cannot be split across workers.
    """
    config = BatchConfig(engine, num_workers, threads_per_worker, batch_size, address)
    if config.engine == "local":
        return evaluate(model, data, policy, batch_size, baseline, list(providers or ()), order=order)
    policy = policy or TestTimePolicy()
    if policy.continual:
        raise ConfigError(
            "continual adaptation (the default for --ttt) adapts along one stream of batches; the ray engine "
            "splits the batches across workers",
            hint="run it with --engine local, or add --episodic (adaptation per batch works on ray)",
        )
    require_pyarrow()
    require_ray()
    path = resolve_model_path(model).resolve()
    order = stream_order(order, policy.seed)
    dataset = ordered(data, order)
    if dataset.labels is None:
        raise TestTimeError(f"evaluate needs labelled data; {dataset.source} has no labels")
    results = []
    for pol in [policy] + ([TestTimePolicy()] if baseline else []):
        spec = EvalSpec(str(path), dataset, pol, config.threads_per_worker, tuple(providers or ()))
        metrics, provider, facts = _measure(dataset, spec, config)
        results.append(
            EvaluationResult(
                batch_size=batch_size,
                policy=pol.to_dict(),
                order=str(order),
                stream=False,
                provider=provider,
                model=str(path),
                extra=facts,
                **metrics,
            )
        )
    return replace(results[0], baseline=results[1]) if baseline else results[0]
