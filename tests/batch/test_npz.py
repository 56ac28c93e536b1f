"""``--data FILE.npz``: model-ready arrays (``x`` or one per graph input, rows on axis 0) skip the processor
and give the rows the task pipeline gives for the raw inputs they were made from; arrays that fit no input
are refused before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import modelexport
from modelexport.cli.app import main
from modelexport.errors import ConfigError, DatasetError
from modelexport.inference.processors import ONNXAutoProcessor
from tests.batch.conftest import SENTENCES
from tests.batch.helpers import assert_same_rows, read_predictions

pytest.importorskip("pyarrow", reason="batch inference needs pyarrow: pip install 'modelexport[distributed]'")


def _text_feeds(model: Path, path: Path, texts: list[str], **extra: Any) -> Path:
    np.savez(path, **ONNXAutoProcessor.from_model(model)(texts=texts), **extra)
    return path


@pytest.mark.integration
def test_named_feeds_give_the_pipelines_rows(seq_cls: Path, tmp_path: Path, capsys: Any) -> None:
    """Token ids padded to the longest of all 12 texts (not per batch): the scores still match."""
    texts = [f"{SENTENCES[i % 6]} {'good ' * (i % 3)}".strip() for i in range(12)]
    data = _text_feeds(seq_cls, tmp_path / "feeds.npz", texts, ids=np.arange(100, 112))
    out = tmp_path / "pred.jsonl"
    argv = ["infer", str(seq_cls), "--data", str(data), "--output", str(out), "--keep-columns", "ids"]
    assert main([*argv, "--batch-size", "5"]) == 0
    assert "wrote 12 row(s)" in capsys.readouterr().out
    want = modelexport.pipeline(model=seq_cls)(texts)
    rows = read_predictions(out)
    assert [r["ids"] for r in rows] == list(range(100, 112))
    assert_same_rows(
        [{k: v for k, v in r.items() if k != "ids"} for r in rows],
        [{"id": i, **w, "error": None} for i, w in enumerate(want)],
    )


@pytest.mark.integration
def test_x_feeds_a_single_input_image_model(cnn_export: Any, image_folder: Path, tmp_path: Path) -> None:
    """``x`` is what the image processor makes (N x 1 x 8 x 8 floats); top-k lists equal the pipeline's."""
    model = cnn_export.output_dir
    paths = [str(p) for p in sorted(image_folder.rglob("*.png"))[:10]]
    (pixels,) = ONNXAutoProcessor.from_model(model)(images=paths).values()  # the one input, as named
    np.savez(tmp_path / "x.npz", x=pixels)
    result = modelexport.batch_infer(model, tmp_path / "x.npz", tmp_path / "pred.parquet", batch_size=4)
    want = modelexport.pipeline(model=model)(paths)
    assert (result.rows, result.errors) == (10, 0)
    assert_same_rows(
        read_predictions(tmp_path / "pred.parquet"),
        [{"id": i, "prediction": w, "error": None} for i, w in enumerate(want)],
    )


def test_arrays_that_fit_no_input_are_refused(seq_cls: Path, cnn_export: Any, tmp_path: Path) -> None:
    out = tmp_path / "pred.parquet"
    np.savez(tmp_path / "names.npz", tokens=np.zeros((3, 4), np.int64))
    with pytest.raises(DatasetError, match="no array for model input"):
        modelexport.batch_infer(seq_cls, tmp_path / "names.npz", out)
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 4), np.int64))
    with pytest.raises(DatasetError, match="single-input model"):
        modelexport.batch_infer(seq_cls, tmp_path / "x.npz", out)
    np.savez(tmp_path / "flat.npz", x=np.zeros((3, 64), np.float32))  # raw pixels, not N x 1 x 8 x 8
    with pytest.raises(
        DatasetError,
        match=r"examples of shape \[64\]; the model's input 'x' takes examples of shape \[1, 8, 8\]",
    ):
        modelexport.batch_infer(cnn_export.output_dir, tmp_path / "flat.npz", out)
    _text_feeds(seq_cls, tmp_path / "feeds.npz", ["hello world"])
    with pytest.raises(DatasetError, match="1-D array"):
        modelexport.batch_infer(seq_cls, tmp_path / "feeds.npz", out, keep_columns="input_ids")
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob(".pred*"))


def test_tasks_that_need_raw_inputs_refuse_feeds(task_export: Any, tmp_path: Path) -> None:
    """Token classification reads the texts' offsets: model-ready ids cannot give its entities."""
    model = Path(task_export("token_cls").output_dir)
    data = _text_feeds(model, tmp_path / "feeds.npz", ["john lives in paris"])
    with pytest.raises(ConfigError, match="token-classification; its outputs need the raw inputs"):
        modelexport.batch_infer(model, data, tmp_path / "pred.parquet")
