"""Input rows for batch inference: one Arrow table with ``id`` (the row's index in the input), the raw input
(a text or an image path) and the columns the user keeps.

A ``.npz`` holds model-ready arrays instead (the one ``.npz`` convention of :mod:`modelexport.data`: ``x`` for
a single-input model, or one array per graph input; rows on axis 0): they are checked against the model's
inputs here and travel as one tensor column per graph input, skipping the processor.

Rows stay raw here: images are decoded and texts tokenized in the worker that runs them (the processor is
the model's own, see :mod:`modelexport.batch.worker`), so the driver holds only strings. Table files are
parsed by the dataset readers (:func:`modelexport.data.readers.iter_table`, the one set of parsing rules:
``evaluate --data x.csv`` and ``infer --data x.csv`` see the same values) and built into Arrow (what Ray
Data moves between processes) a chunk of rows at a time; the input column is found by the dataset readers'
rule (:func:`~modelexport.data.readers.guess_input_column`), and an image path is relative to the file that
lists it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ..data import load_dataset
from ..data.readers import (
    IMAGE_COLUMNS,
    IMAGE_SUFFIXES,
    TABLE_PARSERS,
    TEXT_COLUMNS,
    Row,
    guess_input_column,
    guess_label_column,
    iter_table,
    read_npz,
    scan_image_folder,
    table_columns,
)
from ..errors import ConfigError, DatasetError, first_line
from ..inference.feeds import dataset_feeds
from ..inference.processors import ONNXAutoProcessor

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Rows",
    "read_rows",
    "INPUT",
    "ID",
    "ERROR",
    "FEED",
    "require_pyarrow",
    "feed_arrays",
]

ID, INPUT, ERROR = "id", "_input", "error"
#: Column prefix of a model-ready input (``.npz``): ``_feed.input_ids``...
FEED = "_feed."


def require_pyarrow() -> ModuleType:
    """pyarrow (tables, Parquet), which ``modelexport[distributed]`` installs with Ray Data."""
    try:
        import pyarrow
    except ImportError as exc:
        raise ConfigError(
            "batch inference (--data) needs pyarrow", hint="pip install 'modelexport[distributed]'"
        ) from exc
    return pyarrow


@dataclass(frozen=True)
class Rows:
    """``table`` has ``id``, ``_input`` and the kept columns; ``kind`` is ``text``, ``image`` (paths) or
    ``feeds`` (a ``.npz``: one ``_feed.NAME`` column per graph input instead of ``_input``)."""

    table: pa.Table
    kind: str
    source: str
    input_column: str

    def __len__(self) -> int:
        return self.table.num_rows


#: Rows turned into one Arrow table at a time: a large file is never held as Python objects whole.
_CHUNK_ROWS = 65_536


def _column(values: list[object]) -> pa.Array:
    """One column's values in Arrow; a column that mixes types (a JSON file's ``3.0`` beside ``"a"``) holds
    their text, as the dataset reader reads each cell (``str(value)``)."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _arrow_chunk(rows: list[Row]) -> pa.Table:
    """Rows as one Arrow table, a column per key (a record without the key gives null)."""
    import pyarrow as pa

    records = [row.values for row in rows]
    return pa.table({name: _column([r.get(name) for r in records]) for name in table_columns(rows)})


def _read_file(path: Path) -> pa.Table:
    """A table file parsed by the dataset readers' rules (:func:`modelexport.data.readers.iter_table`),
    built into Arrow one chunk of rows at a time."""
    import pyarrow as pa

    rows = iter_table(path)
    chunks = []
    while chunk := list(itertools.islice(rows, _CHUNK_ROWS)):
        chunks.append(_arrow_chunk(chunk))
    try:
        return pa.concat_tables(chunks, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DatasetError(
            f"{path}: a column changes value type along the file ({first_line(exc)})",
            hint="give each column one type (quote the numbers of a text column)",
        ) from exc


def _image_folder(root: Path) -> pa.Table:
    """Flat images, or one sub-folder per class (kept as ``label``): the dataset readers' scan."""
    import pyarrow as pa

    files, labels = scan_image_folder(root)
    paths = [str(f) for f in files]
    return pa.table({"path": paths} if labels is None else {"path": paths, "label": labels})


def _input_column(names: list[str], given: str | None, source: str) -> str:
    if given is not None:
        if given not in names:
            raise DatasetError(f"{source}: no column {given!r}; columns are {names}")
        return given
    found = guess_input_column(names, guess_label_column(names))
    if found is not None:
        return found
    raise DatasetError(
        f"{source}: no input column found among {names}",
        hint=f"name it one of {', '.join(TEXT_COLUMNS + IMAGE_COLUMNS)} or pass --input-column",
    )


def _is_image_column(values: list[object]) -> bool:
    given = [v for v in values if isinstance(v, str) and v.strip()]
    return bool(given) and all(v.lower().endswith(IMAGE_SUFFIXES) for v in given)


def _table(data: str | os.PathLike[str] | Sequence[str]) -> tuple[pa.Table, str, Path | None]:
    """(Arrow table, source name, folder image paths are relative to)."""
    import pyarrow as pa

    if not isinstance(data, (str, os.PathLike)):
        return pa.table({"input": [None if v is None else str(v) for v in data]}), "<list>", Path.cwd()
    path = Path(data)
    if path.is_dir():
        return _image_folder(path), str(path), path
    if path.suffix.lower() not in TABLE_PARSERS:
        raise DatasetError(
            f"{path}: batch inference cannot read {path.suffix or 'files without an extension'}",
            hint=f"use {', '.join(TABLE_PARSERS)}, .npz or an image folder",
        )
    if not path.is_file():
        raise DatasetError(f"input data not found: {path}")
    return _read_file(path), str(path), path.parent


def _tensor_column(array: np.ndarray) -> pa.Array:
    import pyarrow as pa

    if array.ndim == 1:
        return pa.array(array)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))


def feed_arrays(table: pa.Table) -> dict[str, np.ndarray]:
    """The model-ready inputs of a batch of ``feeds`` rows: graph input name -> array (rows on axis 0)."""
    out = {}
    for name in table.column_names:
        if name.startswith(FEED):
            column = table.column(name).combine_chunks()
            ndarray = getattr(column, "to_numpy_ndarray", None)
            out[name[len(FEED) :]] = ndarray() if ndarray else column.to_numpy(zero_copy_only=False)
    return out


def _npz_rows(path: Path, keep_columns: Sequence[str], input_column: str | None, model: Path | None) -> Rows:
    """A ``.npz`` of model-ready arrays, checked against (and cast to) the model's inputs."""
    import pyarrow as pa

    if input_column is not None:
        raise ConfigError(f"{path}: --input-column names a table column; a .npz's inputs are its arrays")
    if model is None:
        raise ConfigError(f"{path}: a .npz holds model-ready arrays; reading it needs the model")
    dataset = load_dataset(path, require_labels=False)
    sources = ONNXAutoProcessor.sources(model)
    feeds = dataset_feeds(dataset, sources)  # checked against the model's input shapes
    n = len(dataset)
    kept = {c: a for c, a in read_npz(path).items() if c in keep_columns}
    bad = [c for c in keep_columns if c not in kept or kept[c].ndim != 1 or len(kept[c]) != n]
    if bad:
        raise DatasetError(f"{path}: no 1-D array(s) {bad} of {n} rows to keep")
    columns = {ID: pa.array(range(n), pa.int64())}
    columns.update({FEED + name: _tensor_column(array) for name, array in feeds.items()})
    columns.update({c: pa.array(v) for c, v in kept.items()})
    return Rows(pa.table(columns), "feeds", str(path), ",".join(feeds))


def read_rows(
    data: str | os.PathLike[str] | Sequence[str],
    keep_columns: Sequence[str] = (),
    input_column: str | None = None,
    model: Path | None = None,
) -> Rows:
    """The rows of ``data``: a table file, an image folder, a ``.txt``, a list of texts or image paths, or
    a ``.npz`` of model-ready arrays for ``model``."""
    import pyarrow as pa

    require_pyarrow()
    if isinstance(data, (str, os.PathLike)) and Path(data).suffix.lower() == ".npz":
        return _npz_rows(Path(data), keep_columns, input_column, model)
    table, source, base = _table(data)
    if table.num_rows == 0:
        raise DatasetError(f"{source}: has no rows")
    column = _input_column(table.column_names, input_column, source)
    missing = [c for c in keep_columns if c not in table.column_names]
    if missing:
        raise DatasetError(f"{source}: no column(s) {missing} to keep; columns are {table.column_names}")
    values = table.column(column).to_pylist()
    kind = "image" if _is_image_column(values) else "text"
    if kind == "image":
        values = [
            None if v is None else str(base / v) if base and not Path(v).is_absolute() else v for v in values
        ]
    inputs = pa.array([v if v is None or isinstance(v, str) else str(v) for v in values], pa.string())
    columns = {ID: pa.array(range(table.num_rows), pa.int64()), INPUT: inputs}
    columns.update({c: table.column(c) for c in keep_columns})
    return Rows(pa.table(columns), kind, source, column)
