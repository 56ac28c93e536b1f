"""``modelexport infer`` with test-time compute from the command line: an ensemble (a model and its int8 twin)
and MC dropout added to the embedded policy (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import modelexport
from modelexport.cli.app import main

TEXTS = ["a good film", "a bad one"]


def _scores(preds: list[Any]) -> list[dict[str, float]]:
    return [{d["label"]: d["score"] for d in p} for p in preds]


@pytest.mark.must
@pytest.mark.integration
def test_infer_ensemble_averages_the_model_and_its_int8_twin(
    task_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = task_export("seq_cls").output_dir
    twin = tmp_path / "int8"
    modelexport.quantize(folder, f"{twin}/")
    alone = _scores(modelexport.pipeline(model=str(folder))(TEXTS, top_k=None))
    other = _scores(modelexport.pipeline(model=str(twin))(TEXTS, top_k=None))
    assert alone != other  # the int8 twin is another model: the average is not either one
    labels = str(len(alone[0]))
    args = ["infer", str(folder), "--text", TEXTS[0], "--text", TEXTS[1], "--top-k", labels, "--json"]
    assert main([*args, "--ensemble", str(twin)]) == 0
    merged = _scores(json.loads(capsys.readouterr().out)["predictions"])
    for a, b, m in zip(alone, other, merged, strict=True):
        assert m == pytest.approx({k: (a[k] + b[k]) / 2 for k in a}, abs=1e-5)


@pytest.mark.must
def test_infer_test_time_options_are_checked_first(
    task_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = str(task_export("seq_cls").output_dir)
    assert main(["infer", folder, "--text", "x", "--feedback", "logits:prev"]) == 1
    assert "need --iterate" in capsys.readouterr().err
    assert main(["infer", folder, "--text", "x", "--iterate", "2"]) == 1
    assert "--feedback OUTPUT:INPUT" in capsys.readouterr().err
    data = tmp_path / "d.csv"
    data.write_text("text\nhello\n")
    assert (
        main(
            [
                "infer",
                folder,
                "--data",
                str(data),
                "--output",
                str(tmp_path / "p.jsonl"),
                "--ensemble",
                folder,
            ]
        )
        == 1
    )
    assert "not --data" in capsys.readouterr().err


@pytest.mark.must
@pytest.mark.integration
def test_infer_mc_dropout_needs_dropout_and_says_so(
    task_export: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny text model is exported without --keep-dropout: MC dropout is refused in one line naming why."""
    folder = str(task_export("seq_cls").output_dir)
    assert main(["infer", folder, "--text", "x", "--mc-dropout", "4"]) == 1
    assert "no Dropout nodes" in capsys.readouterr().err
