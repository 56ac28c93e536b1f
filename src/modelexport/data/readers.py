"""Dataset readers, one registry entry per format; ``load_dataset`` picks the first that claims the path.

Formats: CSV/TSV/JSON/JSONL tables (text + label, or image path + label), an image folder with one
sub-folder per class, ``.npz`` arrays and built-ins such as ``sklearn:digits``.
Every error names the file and, for rows, the line and its content.

The ``.npz`` convention (the only one; training, evaluation, calibration and ``quantize --eval-data``
all read it here), samples on axis 0:

- ``x``: the input of a single-input model (e.g. images as N x C x H x W float), *or* one array per
  graph input named after it (``input_ids``, ``attention_mask``, ...: model-ready feeds);
- ``y``: labels, integer ids or words (optional only where labels are, i.e. calibration);
- ``label_names``: optional names of the integer ids ``0..K-1``.

Labels anywhere may be words (``positive``) or ids (``1``); :func:`encode_labels` maps both to ``0..K-1``.

Table files are parsed here and nowhere else (:data:`TABLE_PARSERS`, :func:`iter_table`): ``evaluate``,
training and calibration read them through :func:`load_dataset`, batch inference (local and Ray) turns the
same rows into Arrow blocks (:mod:`modelexport.batch.source`), so one file gives the same values to every
command. The rules, one set for every reader:

- UTF-8 text, a leading byte-order mark ignored; rows that are blank (or whitespace only) are skipped;
- CSV/TSV: the first row is the header (names stripped, each once); a cell is the text as written, never
  converted (``007`` stays ``"007"``, ``1e3`` stays ``"1e3"``); an empty cell (quoted or not) is missing
  (None); a row with another number of fields than the header is an error naming its line;
- JSON (a list of objects, or one under ``data``/``examples``/``rows``/``records``), JSONL/NDJSON (one
  object per line) and Parquet keep their own types (numbers, booleans, null);
- ``.txt``: one input per line, as the column ``input``;
- an input cell is taken as its text (``str(value)``) by the dataset reader and batch inference alike.

Parsers stream (a ``.json`` document is parsed whole). Parquet and ``.txt`` are batch inference's inputs only:
``load_dataset`` claims the :data:`TABLE_SUFFIXES`.
"""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._registry import Registry
from ..errors import DatasetError, ModelExportError, first_line
from .dataset import Dataset, encode_labels

__all__ = [
    "load_dataset",
    "register_reader",
    "READERS",
    "BUILTINS",
    "ReadOptions",
    "IMAGE_SUFFIXES",
    "read_npz",
    "scan_image_folder",
    "Row",
    "TABLE_PARSERS",
    "iter_table",
    "read_table",
    "table_columns",
    "guess_input_column",
    "guess_label_column",
]

log = logging.getLogger(__name__)

TEXT_COLUMNS = (
    "text",
    "sentence",
    "review",
    "content",
    "document",
    "sentence1",
    "utterance",
    "comment",
    "question",
    "input",
)
LABEL_COLUMNS = ("label", "labels", "class", "target", "category", "sentiment", "y")
IMAGE_COLUMNS = ("image", "image_path", "path", "file", "filename", "filepath", "img")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
#: The table files ``load_dataset`` reads (the parsers, :data:`TABLE_PARSERS`, also take Parquet and .txt).
TABLE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson")
#: The ``.npz`` keys (see the module docstring).
NPZ_INPUT, NPZ_LABELS, NPZ_LABEL_NAMES = "x", "y", "label_names"
_NPZ_LABEL_ALIASES = ("labels", "label", "Y")


@dataclass(frozen=True)
class ReadOptions:
    """Column names given by the user (``None``: auto-detect); whether data without labels is an error."""

    text_column: str | None = None
    label_column: str | None = None
    require_labels: bool = True

    @property
    def min_classes(self) -> int:
        """A classifier needs two classes to learn; data read for its inputs only may hold one."""
        return 2 if self.require_labels else 1


@dataclass(frozen=True)
class Reader:
    """A format: ``matches(spec)`` says whether it reads ``spec``; ``read(spec, options)`` returns the dataset."""

    name: str
    matches: Callable[[str], bool]
    read: Callable[[str, ReadOptions], Dataset]


#: Format name -> reader, tried in registration order.
READERS: Registry[Reader] = Registry("dataset format", error=DatasetError)
#: ``sklearn:NAME`` style built-in datasets: spec -> loader.
BUILTINS: Registry[Callable[[], Dataset]] = Registry("built-in dataset", error=DatasetError)


def register_reader(
    name: str, matches: Callable[[str], bool]
) -> Callable[[Callable[[str, ReadOptions], Dataset]], Callable[[str, ReadOptions], Dataset]]:
    """Decorator: add a reader for the specs ``matches`` accepts."""
    return READERS.register_as(name, lambda fn: Reader(name, matches, fn))


def load_dataset(
    path_or_spec: str | Path,
    text_column: str | None = None,
    label_column: str | None = None,
    *,
    require_labels: bool = True,
) -> Dataset:
    """Read a dataset from a file, folder or built-in spec (see the module docstring for formats).

    ``require_labels=False`` (calibration) also accepts data without labels (no label column, no ``y``,
    a flat folder of images) and a single class; its ``Dataset.labels`` is then None.
    """
    spec = str(path_or_spec)
    options = ReadOptions(text_column, label_column, require_labels)
    for reader in READERS.values():
        if reader.matches(spec):
            dataset = reader.read(spec, options)
            log.info("%s: %s", spec, dataset.describe())
            return dataset
    if not Path(spec).exists():
        raise DatasetError(
            f"dataset not found: {spec}",
            hint=f"pass an existing file or folder, or one of the built-ins: {', '.join(sorted(BUILTINS))}",
        )
    raise DatasetError(
        f"{spec}: unknown dataset format",
        hint=f"use a {'/'.join(s.lstrip('.') for s in TABLE_SUFFIXES)} file, .npz (x or named inputs, y), an image folder "
        f"(one sub-folder per class) or one of: {', '.join(sorted(BUILTINS))}",
    )


# --- built-ins -------------------------------------------------------------------------------------


@register_reader(
    "builtin", lambda spec: ":" in spec and spec.split(":", 1)[0] in {k.split(":")[0] for k in BUILTINS}
)
def _read_builtin(spec: str, options: ReadOptions) -> Dataset:
    loader = BUILTINS.find(spec)
    if loader is None:
        raise DatasetError(f"unknown built-in dataset {spec!r}; available: {', '.join(sorted(BUILTINS))}")
    return loader()


@BUILTINS.register("sklearn:digits")
def _digits() -> Dataset:
    """The 1,797 8x8 handwritten digits, as grayscale uint8 images (0..16 scaled to 0..255)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise DatasetError(
            "sklearn:digits needs scikit-learn", hint="pip install 'modelexport[train]'"
        ) from exc
    digits = load_digits()
    images = [np.rint(img * (255.0 / 16.0)).astype(np.uint8)[:, :, None] for img in digits.images]
    names = [str(i) for i in range(10)]
    info = {"format": "sklearn", "image_size": [8, 8], "channels": 1}
    return Dataset(
        "image", [int(y) for y in digits.target], names, images=images, source="sklearn:digits", info=info
    )


# --- .npz ------------------------------------------------------------------------------------------


def read_npz(path: Path, error: type[ModelExportError] = DatasetError) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickled objects: a file from elsewhere runs no code), or ``error``
    naming the file: the one ``.npz`` reader of datasets, batch inputs and inspection inputs."""
    try:
        with Path(path).open("rb") as fh, np.load(fh, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile and numpy raise many types on a damaged archive
        raise error(
            f"{path}: cannot read as .npz: {type(exc).__name__}: {first_line(exc)}",
            hint=_NPZ_HINT
            if error is DatasetError
            else None,  # the dataset convention; others keep their own
        ) from exc


@register_reader("npz", lambda spec: spec.lower().endswith(".npz"))
def _read_npz(spec: str, options: ReadOptions) -> Dataset:
    path = _existing_file(spec)
    arrays = read_npz(path)
    found = sorted(arrays)
    y = arrays.pop(NPZ_LABELS, None)
    label_names = arrays.pop(NPZ_LABEL_NAMES, None)
    alias = next((k for k in _NPZ_LABEL_ALIASES if k in arrays), None)
    if y is None and alias is not None:
        raise DatasetError(
            f"{path}: labels go in the array 'y', found {alias!r}", hint=f"np.savez(path, x=..., y={alias})"
        )
    if NPZ_INPUT in arrays and len(arrays) > 1:
        raise DatasetError(
            f"{path}: holds 'x' and named arrays {sorted(set(arrays) - {NPZ_INPUT})}; use one of the two",
            hint="'x' for a single-input model, or one array per graph input named after it",
        )
    if not arrays:
        raise DatasetError(f"{path}: no input arrays (found {found})", hint=_NPZ_HINT)
    _check_npz_inputs(path, arrays)
    n = len(next(iter(arrays.values())))
    if n == 0:
        raise DatasetError(f"{path}: is empty (0 examples)")
    labels, names = _npz_labels(path, y, label_names, n, options)
    info = {"format": "npz", "arrays": {k: list(v.shape[1:]) for k, v in arrays.items()}}
    if NPZ_INPUT in arrays:
        x = arrays[NPZ_INPUT]
        info["shape"] = list(x.shape[1:])
        return Dataset("tensor", labels, names, x=x.astype(np.float32), source=str(path), info=info)
    return Dataset("feeds", labels, names, feeds=arrays, source=str(path), info=info)


_NPZ_HINT = (
    "np.savez(path, x=inputs, y=labels), or one array per graph input: np.savez(path, input_ids=..., y=...)"
)


def _check_npz_inputs(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Input arrays are numbers with an examples axis first, the same number of examples each."""
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise DatasetError(
                f"{path}: array {name!r} holds {array.dtype} values, not numbers", hint=_NPZ_HINT
            )
        if array.ndim == 0:
            raise DatasetError(
                f"{path}: array {name!r} is a scalar; it needs an examples axis first", hint=_NPZ_HINT
            )
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise DatasetError(
            f"{path}: the input arrays hold different numbers of examples {lengths}", hint=_NPZ_HINT
        )


def _npz_labels(
    path: Path, y: np.ndarray | None, label_names: np.ndarray | None, n: int, options: ReadOptions
) -> tuple[list[int] | None, list[str]]:
    if y is None:
        if options.require_labels:
            raise DatasetError(f"{path}: needs labels in an array 'y'", hint=_NPZ_HINT)
        return None, []
    y = y.reshape(-1)
    if len(y) != n:
        raise DatasetError(f"{path}: the inputs have {n} rows but 'y' has {len(y)} labels")
    labels, names = encode_labels(y.tolist(), str(path), min_classes=options.min_classes)
    if label_names is not None and len(label_names) == len(names):
        names = [str(v) for v in label_names]
    return labels, names


# --- image folder ----------------------------------------------------------------------------------


def _is_image_folder(spec: str) -> bool:
    path = Path(spec)
    return path.is_dir()


def _images_in(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)


def scan_image_folder(root: Path, labelled: bool = False) -> tuple[list[Path], list[str] | None]:
    """The images of a folder in sorted order, with their class names when it has one sub-folder per class
    (``(files, None)`` for a flat folder of images, unless ``labelled`` asks for the class sub-folders):
    the one scan behind datasets and batch inference, so both see the same files in the same order."""
    flat = _images_in(root)
    if flat and not labelled:
        return flat, None
    files: list[Path] = []
    classes: list[str] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found = _images_in(sub)
        if not found:
            log.warning("%s: no images, class skipped", sub)
        files.extend(found)
        classes.extend([sub.name] * len(found))
    if not files:
        raise DatasetError(
            f"{root}: no images found",
            hint=f"an image folder holds {', '.join(IMAGE_SUFFIXES)} files, or one sub-folder of them per class",
        )
    return files, classes


@register_reader("image_folder", _is_image_folder)
def _read_image_folder(spec: str, options: ReadOptions) -> Dataset:
    root = Path(spec)
    files, raw = scan_image_folder(root, labelled=options.require_labels)
    if raw is None:  # a plain folder of images: inputs without labels
        images, info = _load_images(files, [str(f) for f in files])
        return Dataset("image", None, [], images=images, source=str(root), info={"format": "images", **info})
    labels, names = encode_labels(raw, str(root), min_classes=options.min_classes)
    images, info = _load_images(files, [str(f) for f in files])
    return Dataset(
        "image", labels, names, images=images, source=str(root), info={"format": "image_folder", **info}
    )


def _load_images(paths: list[Path], where: list[str]) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Open every image, convert to one mode (L when all are grayscale, else RGB) and one (modal) size."""
    from PIL import Image, UnidentifiedImageError

    opened = []
    for path, loc in zip(paths, where, strict=True):
        try:
            with Image.open(path) as img:
                img.load()
                opened.append(img.copy())
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise DatasetError(
                f"{loc}: cannot read image {str(path)!r}: {exc}",
                hint="remove or replace the unreadable image",
            ) from exc
    mode = "L" if all(img.mode in ("L", "1", "I", "I;16", "LA") for img in opened) else "RGB"
    size = Counter(img.size for img in opened).most_common(1)[0][0]
    resized = sum(img.size != size for img in opened)
    if resized:
        log.warning("%d image(s) resized to the most common size %dx%d", resized, size[0], size[1])
    images = []
    for img in opened:
        img = img.convert(mode)
        if img.size != size:
            img = img.resize(size, Image.BILINEAR)
        arr = np.asarray(img, dtype=np.uint8)
        images.append(arr[:, :, None] if arr.ndim == 2 else arr)
    return images, {"image_size": [size[1], size[0]], "channels": 1 if mode == "L" else 3, "resized": resized}


# --- tables: CSV / TSV / JSON / JSONL / Parquet / .txt --------------------------------------------


class Row(NamedTuple):
    """One record of a table file: its line (record number for .json and Parquet), its values by column, and
    its raw text (for messages)."""

    line: int
    values: dict[str, object]
    raw: str


def _existing_file(spec: str | Path) -> Path:
    path = Path(spec)
    if not path.is_file():
        raise DatasetError(
            f"dataset not found: {path}",
            hint="check the path: a CSV/TSV/JSON/JSONL/Parquet/.npz file, an image folder, or sklearn:digits",
        )
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: is empty", hint="the file has no header and no rows")
    return path


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= 120 else text[:117] + "..."


def _read_delimited(path: Path, delimiter: str) -> Iterator[Row]:
    """Cells are the text as written (``007`` stays ``007``); an empty cell is missing (None)."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DatasetError(f"{path}: is empty") from None
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise DatasetError(f"{path}, line 1: the header names {twice} more than once")
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            raw = delimiter.join(row)
            if len(row) != len(header):
                raise DatasetError(
                    f"{path}, line {reader.line_num}: {len(row)} fields, the header has {len(header)}: {_snippet(raw)}",
                    hint="quote fields that contain the delimiter",
                )
            values = {h: (c if c != "" else None) for h, c in zip(header, row, strict=True)}
            yield Row(reader.line_num, values, raw)


def _read_json(path: Path) -> Iterator[Row]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}, line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    if isinstance(data, dict):
        data = next((v for k, v in data.items() if k in ("data", "examples", "rows", "records")), data)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetError(
            f'{path}: JSON must be a list of objects (one per example), e.g. [{{"text": ..., "label": ...}}]'
        )
    for i, rec in enumerate(data):
        yield Row(i + 1, rec, json.dumps(rec))


def _read_jsonl(path: Path) -> Iterator[Row]:
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"{path}, line {lineno}: not valid JSON ({exc.msg}): {_snippet(line)}"
                ) from exc
            if not isinstance(rec, dict):
                raise DatasetError(f"{path}, line {lineno}: expected a JSON object: {_snippet(line)}")
            yield Row(lineno, rec, line)


def _read_lines(path: Path) -> Iterator[Row]:
    """One input per line, as column ``input`` (a name the text columns include); blank lines skipped."""
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            text = line.rstrip("\r\n")
            if text.strip():
                yield Row(lineno, {LINES_COLUMN: text}, text)


def _read_parquet(path: Path) -> Iterator[Row]:
    """Parquet's own types, one record batch at a time (a large file is never held whole)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(
            f"{path}: reading Parquet needs pyarrow", hint="pip install 'modelexport[distributed]'"
        ) from exc
    try:
        batches = pq.ParquetFile(path).iter_batches()
        number = 0
        for batch in batches:
            for rec in batch.to_pylist():
                number += 1
                yield Row(number, rec, repr(rec))
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DatasetError(f"{path}: cannot read as Parquet: {first_line(exc)}") from exc


#: Column name of a ``.txt`` file's lines.
LINES_COLUMN = "input"

#: Table file suffix -> its parser: the one set of parsing rules, whichever command reads the file.
TABLE_PARSERS: dict[str, Callable[[Path], Iterator[Row]]] = {
    ".csv": lambda p: _read_delimited(p, ","),
    ".tsv": lambda p: _read_delimited(p, "\t"),
    ".json": _read_json,
    ".jsonl": _read_jsonl,
    ".ndjson": _read_jsonl,
    ".parquet": _read_parquet,
    ".txt": _read_lines,
}


def iter_table(path: str | Path) -> Iterator[Row]:
    """The rows of a table file, read lazily (CSV, TSV, JSONL, Parquet and .txt stream; a .json is one
    document); a file the parsers cannot take, or one without rows, is a DatasetError that says why."""
    path = _existing_file(path)
    parse = TABLE_PARSERS.get(path.suffix.lower())
    if parse is None:
        raise DatasetError(f"{path}: not a table file", hint=f"use one of {', '.join(TABLE_PARSERS)}")
    count = 0
    try:
        for row in parse(path):
            count += 1
            yield row
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start:,})",
            hint="save the file as UTF-8",
        ) from exc
    except csv.Error as exc:
        raise DatasetError(
            f"{path}: the CSV reader stops: {exc} (a field over {csv.field_size_limit():,} characters, or an"
            " unclosed quote)",
            hint="check the quoting; for very long texts use JSONL (one JSON object per line)",
        ) from exc
    except RecursionError as exc:
        raise DatasetError(
            f"{path}: JSON nested deeper than the parser allows", hint="a dataset is a list of flat objects"
        ) from exc
    if count == 0:
        delimited = path.suffix.lower() in (".csv", ".tsv")
        raise DatasetError(f"{path}: has a header but no rows" if delimited else f"{path}: is empty")


def table_columns(rows: Iterable[Row]) -> list[str]:
    """Every column of ``rows``, in the order first seen (records of a JSON file may differ in keys)."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row.values))
    return list(seen)


def read_table(path: str | Path) -> tuple[list[str], list[Row]]:
    """The columns and rows of a table file, all in memory (what a labelled dataset needs)."""
    rows = list(iter_table(path))
    return table_columns(rows), rows


def _named(header: Sequence[str], candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` the header holds (names compared without case)."""
    lower = {h.lower(): h for h in header}
    return next((lower[c] for c in candidates if c in lower), None)


def guess_label_column(header: Sequence[str]) -> str | None:
    """The label column of a table whose user named none: the first of :data:`LABEL_COLUMNS` it holds."""
    return _named(header, LABEL_COLUMNS)


def guess_input_column(header: Sequence[str], label_column: str | None) -> str | None:
    """The input column of a table whose user named none: the first of the text names, else of the image
    names, else the one column besides ``label_column`` (None: no way to tell). The one rule of
    ``load_dataset`` and batch inference."""
    found = _named(header, TEXT_COLUMNS) or _named(header, IMAGE_COLUMNS)
    if found is not None:
        return found
    others = [h for h in header if h != label_column]
    return others[0] if len(others) == 1 else None


def _given_column(header: list[str], given: str, role: str, path: Path) -> str:
    if given not in header:
        raise DatasetError(
            f"{path}, line 1: no {role} column {given!r}; columns are {header}",
            hint=f"pass --{role}_column with one of {header}",
        )
    return given


@register_reader("table", lambda spec: Path(spec).suffix.lower() in TABLE_SUFFIXES)
def _read_table(spec: str, options: ReadOptions) -> Dataset:
    path = _existing_file(spec)
    header, rows = read_table(path)
    given_label = options.label_column
    label_col = (
        guess_label_column(header)
        if given_label is None
        else _given_column(header, given_label, "label", path)
    )
    if label_col is None and options.require_labels:
        raise DatasetError(
            f"{path}, line 1: no label column found among {header}",
            hint=f"name it one of {', '.join(LABEL_COLUMNS)} or pass --label_column",
        )
    given_input = options.text_column
    input_col = (
        guess_input_column(header, label_col)
        if given_input is None
        else _given_column(header, given_input, "text", path)
    )
    if input_col is None:
        raise DatasetError(
            f"{path}, line 1: no text or image column found among {header}",
            hint=f"name it one of {', '.join(TEXT_COLUMNS + IMAGE_COLUMNS)} or pass --text_column",
        )
    return _table_dataset(path, rows, input_col, label_col, options)


def _cell(row: Row, column: str, role: str, path: Path) -> str:
    lineno, rec, raw = row
    value = rec.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        where = f"line {lineno}" if path.suffix.lower() != ".json" else f"record {lineno}"
        raise DatasetError(f"{path}, {where}: empty {role} ({column!r}): {_snippet(raw)}")
    return str(value)


def _table_dataset(
    path: Path, rows: list[Row], input_col: str, label_col: str | None, options: ReadOptions
) -> Dataset:
    values = [_cell(r, input_col, "input", path) for r in rows]
    labels: list[int] | None = None
    names: list[str] = []
    if label_col is not None:
        raw_labels = [_cell(r, label_col, "label", path) for r in rows]
        labels, names = encode_labels(raw_labels, str(path), [r[0] for r in rows], options.min_classes)
    info: dict[str, Any] = {"format": path.suffix.lower().lstrip("."), "label_column": label_col}
    if all(v.lower().endswith(IMAGE_SUFFIXES) for v in values):
        files = [Path(v) if Path(v).is_absolute() else path.parent / v for v in values]
        where = [f"{path}, line {r[0]}" for r in rows]
        images, img_info = _load_images(files, where)
        info.update(image_column=input_col, **img_info)
        return Dataset("image", labels, names, images=images, source=str(path), info=info)
    info["text_column"] = input_col
    return Dataset("text", labels, names, texts=values, source=str(path), info=info)
