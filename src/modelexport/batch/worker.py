"""The worker: one task pipeline (one ONNX Runtime session) per process, rows in, prediction rows out.

The same class runs in the local engine and as a Ray actor. It is built from a :class:`WorkerSpec` that
names the model by path: each worker reads the model itself (nothing large is pickled), once, in
``__init__``. Pre-processing (decoding images, tokenizing) happens here too: each row is checked, then the
batch goes through the pipeline in one call (one tokenizer call, one session run); only a batch that fails
is run again row by row, so that a bad row is written with an ``error`` instead of failing its whole batch.
Model-ready rows (a ``.npz``) skip the processor: the pipeline's ``from_feeds`` runs them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InferenceError, first_line
from ..inference.pipelines import pipeline
from ..inference.processors import to_array
from ..runtime.session import SessionConfig
from ..testtime.policy import TestTimePolicy
from .source import ERROR, ID, INPUT, feed_arrays

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["WorkerSpec", "Predictor", "PREDICTION", "kept_name"]

#: Column holding a pipeline output that is not a dict (ranked label lists, entities, embeddings).
PREDICTION = "prediction"
_MAX_MESSAGE = 300


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, small and picklable: the model's path, never the model."""

    model: str
    kind: str
    task: str | None = None
    threads: int = 1
    batch_size: int = 32
    providers: tuple[str, ...] = ()
    keep_columns: tuple[str, ...] = ()
    #: Keyword arguments of the pipeline call (``top_k``, ``function_to_apply``...).
    call_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The test-time policy (None: the embedded one, False: off), as the pipeline takes it.
    test_time_policy: TestTimePolicy | dict[str, Any] | bool | None = None


def _message(exc: BaseException) -> str:
    text = first_line(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _plain(value: object) -> object:
    """Pipeline outputs as plain Python (numpy scalars and arrays to numbers and lists) for Arrow: the
    fallback of :func:`_column` (it walks every element, so nested lists of floats cost seconds)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _prepare_text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InferenceError("empty text" if isinstance(value, str) else "no text in this row")
    return value


def _prepare_image(value: object) -> np.ndarray:
    if not isinstance(value, str) or not value.strip():
        raise InferenceError("no image path in this row")
    return to_array(value)


def _text_rows(batch: pa.Table) -> list[str | None]:
    return batch.column(INPUT).to_pylist()


def _feed_rows(batch: pa.Table) -> list[dict[str, np.ndarray]]:
    arrays = feed_arrays(batch)
    return [{k: v[i] for k, v in arrays.items()} for i in range(batch.num_rows)]


#: Input kind -> (the rows of an Arrow batch, the check/decoding of one row before the batch runs).
_KINDS: dict[str, tuple[Any, Any]] = {
    "text": (_text_rows, _prepare_text),
    "image": (_text_rows, _prepare_image),
    "feeds": (_feed_rows, lambda row: row),  # checked against the graph's inputs when read
}


def _column(values: list[Any]) -> Any:
    """One output field as an Arrow array: Arrow converts Python and numpy values itself (in C); values it
    cannot take (arrays of more than one dimension) go through :func:`_plain` first."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError):
        return pa.array([_plain(v) for v in values])


class Predictor:
    """Callable on an Arrow batch (``id``, ``_input``, kept columns) -> the output rows of that batch."""

    def __init__(self, spec: WorkerSpec) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one worker, one core: no tokenizer pool
        config = SessionConfig(
            providers=spec.providers, intra_op_num_threads=spec.threads, inter_op_num_threads=1
        )
        self.spec = spec
        self.pipe = pipeline(
            spec.task,
            spec.model,
            batch_size=spec.batch_size,
            session_config=config,
            test_time_policy=spec.test_time_policy,
        )
        self.rows, self.prepare = _KINDS[spec.kind]

    def _run(self, items: list[Any]) -> list[Any]:
        """The pipeline's outputs for a batch of prepared rows."""
        if self.spec.kind == "feeds":
            feeds = {k: np.stack([item[k] for item in items]) for k in items[0]}
            return self.pipe.from_feeds(feeds, **self.spec.call_kwargs)
        return self.pipe(items, **self.spec.call_kwargs)

    def _predict(self, items: list[Any]) -> list[tuple[Any, str | None]]:
        """(prediction, error) per item: the batch in one call; on failure, row by row to find the bad ones."""
        if not items:
            return []
        try:
            return [(p, None) for p in self._run(items)]
        except Exception:  # noqa: BLE001 - any failure is retried per row and written as that row's error
            if len(items) == 1:
                raise
        out: list[tuple[Any, str | None]] = []
        for item in items:
            try:
                out.append((self._run([item])[0], None))
            except Exception as exc:  # noqa: BLE001 - recorded in the row's error column
                out.append((None, _message(exc)))
        return out

    def records(self, inputs: list[Any]) -> list[dict[str, Any]]:
        """One output record (prediction fields and ``error``) per input, in order."""
        prepared: list[Any] = []
        errors: list[str | None] = []
        for value in inputs:
            try:
                prepared.append(self.prepare(value))
                errors.append(None)
            except Exception as exc:  # noqa: BLE001 - a row that cannot be prepared is written with its error
                prepared.append(None)
                errors.append(_message(exc))
        good = [i for i, e in enumerate(errors) if e is None]
        try:
            predicted = self._predict([prepared[i] for i in good])
        except Exception as exc:  # noqa: BLE001 - the only row of the batch failed
            predicted = [(None, _message(exc))]
        records: list[dict[str, Any]] = [{ERROR: e} for e in errors]
        for i, (pred, err) in zip(good, predicted, strict=True):
            fields = pred if isinstance(pred, dict) else {PREDICTION: pred}
            records[i] = {**fields, ERROR: err} if err is None else {ERROR: err}
        return records

    def __call__(self, batch: pa.Table) -> pa.Table:
        import pyarrow as pa

        records = self.records(self.rows(batch))
        # every field of every record (from_pylist would take the first record's fields only: a failed first
        # row would drop the predictions of the rest)
        names = list(dict.fromkeys(k for r in records for k in r))
        table = pa.table({k: _column([r.get(k) for r in records]) for k in names})
        errors = table.column(ERROR).cast(pa.string())  # a string column also when no row failed
        table = table.drop_columns([ERROR]).append_column(ERROR, errors)
        predicted = set(table.column_names)
        kept = [(kept_name(c, predicted), batch.column(c)) for c in self.spec.keep_columns]
        for i, (name, column) in enumerate([(ID, batch.column(ID)), *kept]):
            table = table.add_column(i, name, column)
        return table


def kept_name(column: str, predicted: set[str]) -> str:
    """A kept input column's name in the output: ``NAME_input`` where a prediction field is called NAME."""
    return f"{column}_input" if column in predicted else column
