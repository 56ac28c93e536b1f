"""Flows that cross areas, through the CLI as a user runs them: every command given a package folder
runs the same file (the deployed one), says which, and the data/processor stack is the same everywhere."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from tests.pipeline.test_pipeline import write_digit_folder


def _json(capsys: pytest.CaptureFixture[str], args: list[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def pipeline_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``modelexport pipeline --output_model OUT/clf.onnx --quantize dynamic`` on a small digits folder."""
    root = tmp_path_factory.mktemp("flow")
    images = write_digit_folder(root / "imgs", per_class=20)
    out = root / "out"
    args = ["pipeline", "--dataset_path", str(images), "--output_model", str(out / "clf.onnx")]
    args += [
        "--epochs",
        "2",
        "--quantize",
        "dynamic",
        "--tta",
        "false",
        "--ttt",
        "false",
        "--iterations",
        "1",
    ]
    assert main(args) == 0
    return out, images


@pytest.mark.integration
def test_pipeline_folder_runs_the_deployed_model_everywhere(
    pipeline_out: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, images = pipeline_out
    deployed = out / "clf_dynamic.onnx"
    assert {p.name for p in out.glob("*.onnx")} == {"clf.onnx", "clf_dynamic.onnx"}
    assert _json(capsys, ["analyze", str(out), "--format", "json"])["model"] == str(deployed)
    evaluated = _json(capsys, ["evaluate", str(out), "--data", str(images), "--format", "json"])
    assert evaluated["model"] == str(deployed) and evaluated["accuracy"] > 0.2  # 10 classes: chance is 0.1
    image = next((images / "3").glob("*.png"))
    inferred = _json(capsys, ["infer", str(out), "--image", str(image), "--json"])
    assert inferred["model"] == str(deployed)
    direct = _json(capsys, ["infer", str(deployed), "--image", str(image), "--json"])
    assert inferred["predictions"] == direct["predictions"]


@pytest.mark.integration
def test_pipeline_folder_quantizes_statically_from_an_image_folder(
    pipeline_out: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, images = pipeline_out
    target = tmp_path / "q" / "static.onnx"
    args = ["quantize", str(out / "clf.onnx"), "-o", str(target), "--mode", "static"]
    args += ["--calibration-data", str(images), "--calibration-samples", "32", "--format", "json"]
    _json(capsys, args)
    evaluated = _json(capsys, ["evaluate", str(target), "--data", str(images), "--format", "json"])
    assert evaluated["model"] == str(target) and evaluated["accuracy"] > 0.2  # 10 classes: chance is 0.1


@pytest.fixture(scope="module")
def word_label_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Texts of different lengths with word labels (the id2label names of the tiny classifier)."""
    path = tmp_path_factory.mktemp("text") / "dev.csv"
    words = ["good", "bad", "a film", "the plot never quite comes together", "fine", "so so", "great fun"]
    labels = ["negative", "neutral", "positive"]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence", "label"])
        for i in range(24):
            writer.writerow([" ".join(words[: 1 + i % len(words)]), labels[i % 3]])
    return path


@pytest.mark.integration
@pytest.mark.parametrize("method", ["entropy", "minmax"])
def test_text_export_quantize_static_optimize_infer(
    task_export: Any, word_label_csv: Path, tmp_path: Path, method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """export -> quantize (static, text calibration with word labels, ragged lengths) -> optimize -> infer."""
    exported = task_export("seq_cls")
    quantized = tmp_path / "pkg" / "model_static.onnx"
    args = ["quantize", str(exported.output_dir), "-o", str(quantized), "--mode", "static"]
    args += ["--calibration-data", str(word_label_csv), "--calibrate-method", method]
    args += ["--eval-data", str(word_label_csv), "--format", "json"]
    report = _json(capsys, args)
    assert report["output"] == str(quantized)
    optimized = tmp_path / "pkg" / "model_opt.onnx"
    _json(capsys, ["optimize", str(quantized), "-o", str(optimized), "--level", "basic", "--format", "json"])
    texts = ["good", "the plot never quite comes together"]
    fp32 = _json(
        capsys,
        ["infer", str(exported.output_dir), "--text", texts[0], "--text", texts[1], "--top-k", "3", "--json"],
    )
    int8 = _json(
        capsys, ["infer", str(optimized), "--text", texts[0], "--text", texts[1], "--top-k", "3", "--json"]
    )
    assert int8["model"] == str(optimized) and fp32["model"] == str(exported.onnx_path)
    for a, b in zip(fp32["predictions"], int8["predictions"], strict=True):
        assert {p["label"] for p in a} == {p["label"] for p in b}
        assert np.allclose(
            [p["score"] for p in sorted(a, key=lambda p: p["label"])],
            [p["score"] for p in sorted(b, key=lambda p: p["label"])],
            atol=0.1,
        )
