"""Where prediction batches go: staged as Arrow IPC parts beside the output (uncompressed: cheap to write), checked (every id exactly once),
then written as one Parquet or JSONL file renamed into place only when the whole run succeeded."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._io import atomic_path
from ..errors import InferenceError, OutputWriteError
from .config import output_format
from .source import ERROR, ID

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ResultSink", "SinkSummary"]

_EXAMPLES = 5


@dataclass(frozen=True)
class SinkSummary:
    rows: int
    errors: int
    columns: list[str]
    #: The first few failed rows: ``{"id": ..., "error": ...}``.
    error_examples: list[dict[str, Any]] = field(default_factory=list)


def _leaves(name: str, kind: pa.DataType) -> list[tuple[str, pa.DataType]]:
    """(Parquet column path, Arrow type) of every leaf column under one field."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return [leaf for f in kind for leaf in _leaves(f"{name}.{f.name}", f.type)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(f"{name}.list.element", kind.value_type)
    return [(name, kind)]


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet columns worth dictionary encoding: all but floats (scores and embeddings hardly repeat;
    trying a dictionary on them was most of the time spent writing token embeddings)."""
    import pyarrow as pa

    leaves = [leaf for f in schema for leaf in _leaves(f.name, f.type)]
    return [path for path, kind in leaves if not pa.types.is_floating(kind)]


def _read_part(path: Path) -> pa.Table:
    import pyarrow as pa

    with pa.OSFile(str(path), "rb") as source:
        return pa.ipc.open_file(source).read_all()


class ResultSink:
    """Collects output batches for ``expected`` input rows; ``finish()`` writes ``output`` atomically."""

    def __init__(self, output: str | Path, expected: int, keep_columns: tuple[str, ...] = ()) -> None:
        self.output, self.format = Path(output), output_format(output)
        self.keep_columns = keep_columns
        self.seen = np.zeros(expected, dtype=bool)
        self.parts: list[Path] = []
        self.schemas: list[pa.Schema] = []
        self.errors = 0
        self.examples: list[dict[str, Any]] = []
        try:
            self.output.parent.mkdir(parents=True, exist_ok=True)
            self.stage = Path(tempfile.mkdtemp(prefix=f".{self.output.name}.", dir=self.output.parent))
        except OSError as exc:
            raise OutputWriteError(f"cannot write to {self.output.parent}: {exc.strerror or exc}") from exc

    def __enter__(self) -> ResultSink:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)

    def add(self, table: pa.Table) -> None:
        """Stage one batch; a row id seen twice (or outside the input) is an error, never written twice."""
        import pyarrow as pa

        ids = table.column(ID).to_numpy()
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self.seen)):
            raise InferenceError(f"row ids outside 0..{len(self.seen) - 1} in the results")
        if self.seen[ids].any() or len(np.unique(ids)) != len(ids):
            raise InferenceError(f"rows {sorted(set(ids[self.seen[ids]].tolist()))[:5]} came back twice")
        self.seen[ids] = True
        errors = table.column(ERROR).to_pylist()
        failed = [(i, e) for i, e in zip(ids.tolist(), errors, strict=True) if e is not None]
        self.errors += len(failed)
        self.examples += [{ID: i, ERROR: e} for i, e in failed[: _EXAMPLES - len(self.examples)]]
        part = self.stage / f"part-{len(self.parts):06d}.arrow"
        with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        self.parts.append(part)
        self.schemas.append(table.schema)

    def _schema(self) -> pa.Schema:
        import pyarrow as pa

        unified = pa.unify_schemas(self.schemas, promote_options="permissive")
        kept = {*self.keep_columns, *(f"{c}_input" for c in self.keep_columns)}
        head = [ID, *(n for n in unified.names if n in kept)]
        names = head + [n for n in unified.names if n not in head and n != ERROR] + [ERROR]
        return pa.schema([unified.field(n) for n in names])

    def _parts(self, schema: pa.Schema) -> Iterator[pa.Table]:
        """Each staged part with the final schema (a field no row of that part had is all null)."""
        import pyarrow as pa

        for part in self.parts:
            table = _read_part(part)
            yield pa.table(
                [
                    table.column(f.name).cast(f.type)
                    if f.name in table.column_names
                    else pa.nulls(len(table), f.type)
                    for f in schema
                ],
                schema=schema,
            )

    def finish(self) -> SinkSummary:
        """Check that every input row came back, then write the output (temp file, then rename)."""
        missing = np.flatnonzero(~self.seen)
        if len(missing):
            raise InferenceError(
                f"{len(missing)} row(s) missing from the results, e.g. ids {missing[:5].tolist()}"
            )
        import pyarrow.parquet as pq

        schema = self._schema()
        with atomic_path(self.output) as tmp:
            if self.format == "parquet":
                with pq.ParquetWriter(tmp, schema, use_dictionary=dictionary_columns(schema)) as writer:
                    for table in self._parts(schema):
                        writer.write_table(table)
            else:
                with tmp.open("w", encoding="utf-8") as fh:
                    for table in self._parts(schema):
                        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in table.to_pylist())
        return SinkSummary(len(self.seen), self.errors, list(schema.names), self.examples)
