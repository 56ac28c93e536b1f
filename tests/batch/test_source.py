"""One set of parsing rules: a table file read for ``evaluate``/training (``load_dataset``) and for batch
inference (``read_rows``, the rows both the local and the Ray engine run) gives the same values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modelexport.batch.source import INPUT, read_rows
from modelexport.data import load_dataset
from modelexport.data.readers import read_table
from modelexport.errors import DatasetError

pytest.importorskip("pyarrow", reason="batch inference needs pyarrow: pip install 'modelexport[distributed]'")

#: Quoted delimiters and quotes, a line break inside a field, an empty cell (quoted and not), digits that
#: must stay text (a leading zero, an exponent), unicode, and a byte-order mark before the header.
TRICKY_CSV = (
    "\ufefftext,label,zip,note\n"
    '"hello, world",pos,007,\n'
    '"  spaced  ",neg,1e3,"two\nlines"\n'
    'café ☕ naïve,pos,00123,""\n'
    '"say ""hi""",neg,12,x\n'
    "\n"
    "0042,1,-0,  \n"
)

TRICKY_JSONL = "\ufeff" + "\n".join(
    [
        json.dumps({"text": "a, b", "label": "pos", "zip": "007", "note": None}),
        json.dumps({"text": "ünïcödé ✓", "label": "neg", "zip": 12, "note": ""}),
        "",
        json.dumps({"text": "42", "label": "pos", "zip": 1.5}),
        json.dumps({"text": 3.0, "label": "neg", "zip": None, "note": "x"}),
    ]
)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _both(path: Path) -> tuple[list[str | None], list[str | None]]:
    """(the dataset's input texts and label words, the batch rows' inputs and label column)."""
    dataset = load_dataset(path)
    assert dataset.labels is not None and dataset.texts is not None
    rows = read_rows(path, keep_columns=("label", "zip", "note"))
    local = [*dataset.texts, *(dataset.label_names[y] for y in dataset.labels)]
    batch = [*rows.table.column(INPUT).to_pylist(), *(str(v) for v in rows.table.column("label").to_pylist())]
    return local, batch


@pytest.mark.parametrize("name,content", [("tricky.csv", TRICKY_CSV), ("tricky.jsonl", TRICKY_JSONL)])
def test_the_dataset_reader_and_batch_inference_read_a_file_alike(
    tmp_path: Path, name: str, content: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    local, batch = _both(path)
    assert local == batch
    _, records = read_table(path)
    rows = read_rows(path, keep_columns=("label", "zip", "note"))
    for column in ("label", "zip", "note"):  # a column of mixed JSON types travels as its text
        kept = [_text(v) for v in rows.table.column(column).to_pylist()]
        assert kept == [_text(r.values.get(column)) for r in records], column
    assert rows.table.column("id").to_pylist() == list(range(len(records)))


def test_csv_cells_stay_as_written(tmp_path: Path) -> None:
    """Digits stay text and an empty cell is missing, for every command (Arrow's CSV reader once turned
    ``007`` into 7 and ``1e3`` into 1000.0 for ``infer --data`` only)."""
    path = tmp_path / "tricky.csv"
    path.write_text(TRICKY_CSV, encoding="utf-8")
    rows = read_rows(path, keep_columns=("zip", "note"))
    assert rows.table.column(INPUT).to_pylist() == [
        "hello, world",
        "  spaced  ",
        "café ☕ naïve",
        'say "hi"',
        "0042",
    ]
    assert rows.table.column("zip").to_pylist() == ["007", "1e3", "00123", "12", "-0"]
    assert rows.table.column("note").to_pylist() == [None, "two\nlines", None, "x", "  "]
    assert rows.table.column_names == ["id", INPUT, "zip", "note"]


def test_txt_and_parquet_are_read_by_the_same_rules(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    txt = tmp_path / "lines.txt"
    txt.write_text("\ufefffirst, line\n\n  \nsecond\r\nthird\x0cstill third\n", encoding="utf-8")
    assert read_rows(txt).table.column(INPUT).to_pylist() == ["first, line", "second", "third\x0cstill third"]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c", "d"], "label": [0, 1, 0, 1]}), parquet)
    assert read_rows(parquet, keep_columns=("label",)).table.column("label").to_pylist() == [0, 1, 0, 1]
    assert [r.values for r in read_table(parquet)[1]][1] == {"text": "b", "label": 1}


@pytest.mark.parametrize(
    "content,message",
    [
        ("text,label\n", "has a header but no rows"),
        ("text,text\na,b\n", "names ['text'] more than once"),
        ("text,label\na,b,c\n", "line 2: 3 fields"),
    ],
)
def test_both_paths_refuse_a_bad_file_with_one_message(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    for read in (load_dataset, read_rows):
        with pytest.raises(DatasetError, match=re.escape(message)):
            read(path)


@pytest.mark.parametrize(
    "header,column",
    [
        ("Review,label", "Review"),
        ("body,target", "body"),
        ("id,image_path,y", "image_path"),
        ("a,b,label", None),
    ],
)
def test_both_paths_pick_the_same_input_column(tmp_path: Path, header: str, column: str | None) -> None:
    path = tmp_path / "cols.csv"
    width = len(header.split(","))
    cell = "x.png" if "image" in header else "some words"
    rows = "".join(",".join([cell, *(["s"] * (width - 2)), str(i % 2)]) + "\n" for i in range(4))
    if header.startswith("id,"):
        rows = "".join(f"{i},{cell},{i % 2}\n" for i in range(4))
    path.write_text(f"{header}\n{rows}", encoding="utf-8")
    if column is None:
        for read in (load_dataset, read_rows):
            with pytest.raises(DatasetError, match="no (text or image|input) column found"):
                read(path)
        return
    assert read_rows(path).input_column == column
    if "image" not in header:  # the dataset reader would open the images
        assert load_dataset(path).info["text_column"] == column
