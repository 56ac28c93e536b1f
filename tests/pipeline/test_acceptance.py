"""Acceptance on real data (slow): the demo's default run, digits test accuracy, SST-2 with MiniLM."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from modelexport.cli.app import main
from modelexport.data import load_dataset
from modelexport.workflow import run_pipeline
from modelexport.workflow.report import check_report


@pytest.mark.slow
@pytest.mark.integration
def test_demo_default_runs_under_three_minutes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make demo``: ``modelexport pipeline`` with no options (run in a scratch folder)."""
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    rc = main(["pipeline"])
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert rc == 0 and "Pipeline report" in out
    assert (tmp_path / "runs/pipeline/model_dynamic.onnx").is_file()
    assert seconds < 180, f"demo took {seconds:.0f} s"


@pytest.mark.slow
def test_digits_clean_test_accuracy(tmp_path: Path) -> None:
    """Train on 80% of digits (val split inside), test on the held-out 20%: at least 0.95."""
    digits = load_dataset("sklearn:digits")
    train, test = digits.split(0.2, seed=123)
    result = run_pipeline(dataset=train, output_model=str(tmp_path / "digits"), progress=False)
    report = check_report(result.report)
    assert result.program.accuracy(test) >= 0.95  # int8 model with the chosen test-time policy
    assert report["test_time"]["val_accuracy_with_policy"] >= report["test_time"]["val_accuracy_plain"]


@pytest.mark.slow
@pytest.mark.integration
def test_sst2_minilm_accuracy_and_int8(sst2_dir: Path, minilm_dir: Path, tmp_path: Path) -> None:
    """MiniLM fine-tuned on the 12k SST-2 sample: dev accuracy >= 0.85, int8 within 1 point of fp32."""
    result = run_pipeline(
        model_type="text_classifier",
        dataset_path=str(sst2_dir / "train.csv"),
        base_model=str(minilm_dir),
        output_model=str(tmp_path / "sst2"),
        progress=False,
    )
    dev = load_dataset(sst2_dir / "dev.csv")
    int8 = result.program.accuracy(dev)
    result.program.deploy(result.model_path)
    fp32 = result.program.accuracy(dev)
    assert check_report(result.report)["training"]["val_accuracy"] >= 0.85
    assert fp32 >= 0.85 and abs(fp32 - int8) <= 0.01
