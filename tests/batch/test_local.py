"""Batch inference on one process: the output is the task pipeline's own predictions, one row per input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import modelexport
from modelexport.batch.sink import ResultSink
from modelexport.cli.app import main
from modelexport.errors import ConfigError, DatasetError, InferenceError
from tests.batch.helpers import assert_same_rows, read_predictions

pytest.importorskip("pyarrow", reason="batch inference needs pyarrow: pip install 'modelexport[distributed]'")


@pytest.mark.integration
def test_local_rows_are_the_pipelines_predictions(seq_cls: Path, text_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "pred.parquet"
    result = modelexport.batch_infer(seq_cls, text_csv, out, keep_columns="source,label", batch_size=16)
    rows = read_predictions(out)
    texts = [line.split(",")[0] for line in text_csv.read_text().splitlines()[1:]]
    want = modelexport.pipeline(model=seq_cls, batch_size=16)(texts)
    assert result.rows == len(rows) == 60 and result.errors == 0
    assert [r["id"] for r in rows] == list(range(60))
    assert list(rows[0]) == ["id", "source", "label_input", "label", "score", "error"]  # kept label renamed
    assert [r["source"] for r in rows] == [f"s{i}" for i in range(60)]
    assert [r["label_input"] for r in rows] == [str(i % 2) for i in range(60)]  # a CSV cell as written
    assert [r["label"] for r in rows] == [w["label"] for w in want]
    assert [r["score"] for r in rows] == pytest.approx([w["score"] for w in want], abs=1e-6)
    assert all(r["error"] is None for r in rows)
    assert not [p for p in tmp_path.iterdir() if p.name != out.name], "staging left behind"


@pytest.mark.integration
def test_jsonl_holds_the_same_rows_as_parquet(seq_cls: Path, text_csv: Path, tmp_path: Path) -> None:
    modelexport.batch_infer(seq_cls, text_csv, tmp_path / "a.parquet", batch_size=16)
    modelexport.batch_infer(seq_cls, text_csv, tmp_path / "a.jsonl", batch_size=16)
    assert_same_rows(read_predictions(tmp_path / "a.jsonl"), read_predictions(tmp_path / "a.parquet"), tol=0)


@pytest.mark.regression
def test_bad_text_rows_are_written_with_an_error(seq_cls: Path, tmp_path: Path) -> None:
    """A failed row first in its batch once dropped the predictions of the good rows after it."""
    out = tmp_path / "pred.jsonl"
    result = modelexport.batch_infer(seq_cls, ["  ", "i love it", None, "terrible city"], out, batch_size=4)
    rows = read_predictions(out)
    want = modelexport.pipeline(model=seq_cls)(["i love it", "terrible city"])
    assert result.errors == 2 and [e["id"] for e in result.error_examples] == [0, 2]
    assert [rows[0]["error"], rows[2]["error"]] == [
        "InferenceError: empty text",
        "InferenceError: no text in this row",
    ]
    assert rows[0]["label"] is None and rows[0]["score"] is None
    assert [rows[1]["error"], rows[3]["error"]] == [None, None]
    assert [rows[1]["label"], rows[3]["label"]] == [w["label"] for w in want]
    assert [rows[1]["score"], rows[3]["score"]] == pytest.approx([w["score"] for w in want], abs=1e-6)


@pytest.mark.integration
def test_bad_images_are_written_with_an_error(cnn_export: Any, image_folder: Path, tmp_path: Path) -> None:
    good = sorted(image_folder.rglob("*.png"))[:3]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    paths = [str(good[0]), str(tmp_path / "missing.png"), str(good[1]), str(broken), str(good[2])]
    out = tmp_path / "pred.parquet"
    result = modelexport.batch_infer(cnn_export.output_dir, paths, out, batch_size=8)
    rows = read_predictions(out)
    want = modelexport.pipeline(model=cnn_export.output_dir)([str(p) for p in good])
    assert result.rows == 5 and result.errors == 2
    assert [r["id"] for r in rows if r["error"]] == [1, 3]
    assert "not found" in rows[1]["error"] and "Pillow" in rows[3]["error"]
    kept = [r for r in rows if not r["error"]]
    assert_same_rows(
        [{**r, "id": i} for i, r in enumerate(kept)],
        [{"id": i, "prediction": w, "error": None} for i, w in enumerate(want)],
    )


def test_bad_options_fail_before_any_work(seq_cls: Path, text_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown extension"):
        modelexport.batch_infer(seq_cls, text_csv, tmp_path / "pred.csv")
    with pytest.raises(ConfigError, match="local engine runs one worker"):
        modelexport.batch_infer(seq_cls, text_csv, tmp_path / "pred.parquet", num_workers=2)
    with pytest.raises(ConfigError, match="threads_per_worker"):
        modelexport.batch_infer(seq_cls, text_csv, tmp_path / "pred.parquet", threads_per_worker=0)
    with pytest.raises(DatasetError, match="nope"):
        modelexport.batch_infer(seq_cls, text_csv, tmp_path / "pred.parquet", keep_columns="nope")
    assert not list(tmp_path.iterdir())


def test_image_model_refuses_texts(cnn_export: Any, text_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not take text"):
        modelexport.batch_infer(cnn_export.output_dir, text_csv, tmp_path / "pred.parquet")


def test_ray_engine_without_ray_says_how_to_install(
    seq_cls: Path, text_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray is installed here; a None entry in sys.modules is how Python marks a module as not importable."""
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError) as info:
        modelexport.batch_infer(seq_cls, text_csv, tmp_path / "pred.parquet", engine="ray")
    assert "modelexport[distributed]" in info.value.hint


def test_sink_refuses_a_row_twice_and_leaves_nothing_unfinished(tmp_path: Path) -> None:
    import pyarrow as pa

    out = tmp_path / "pred.parquet"
    batch = pa.table(
        {"id": pa.array([0, 1], pa.int64()), "score": [0.5, 0.6], "error": pa.nulls(2, pa.string())}
    )
    with ResultSink(out, expected=3) as sink:
        sink.add(batch)
        with pytest.raises(InferenceError, match="twice"):
            sink.add(batch)
        with pytest.raises(InferenceError, match="1 row\\(s\\) missing"):
            sink.finish()
    assert not list(tmp_path.iterdir())


@pytest.mark.integration
def test_cli_writes_the_dataset(seq_cls: Path, text_csv: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "pred.jsonl"
    args = ["infer", str(seq_cls), "--data", str(text_csv), "--output", str(out), "--keep-columns", "source"]
    assert main(args) == 0
    assert "wrote 60 row(s)" in capsys.readouterr().out
    rows = read_predictions(out)
    assert [r["id"] for r in rows] == list(range(60)) and rows[5]["source"] == "s5"
    assert main(["infer", str(seq_cls), "--text", "hi", "--engine", "ray"]) == 1
    assert "--engine needs --data" in capsys.readouterr().err
