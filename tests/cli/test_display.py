"""The CLI's output layer: lines fit the terminal, hints name the command's own flags, choices say "did you
mean", third-party noise stays hidden, progress shows off a terminal, and quantize says when int8 is poor."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import pytest

from modelexport.cli import display
from modelexport.cli.app import main
from modelexport.cli.hints import adapt_hint
from modelexport.optimize import WeightOnlyConfig
from modelexport.optimize.advice import quantization_advice
from tests.helpers import message_lines


@pytest.mark.smoke
def test_fit_wraps_lists_and_cuts_values_that_cannot_wrap() -> None:
    listed = "  files: " + ", ".join(f"file_{i}.json" for i in range(20))
    text, cut = display.fit(listed, 100)
    lines = text.split("\n")
    assert not cut and len(lines) > 1 and all(len(line) <= 100 for line in lines)
    assert lines[1].startswith("      file_")  # continuation indented under its label
    assert " ".join(line.strip() for line in lines) == listed.strip()  # nothing lost
    text, cut = display.fit("path: /" + "x" * 150, 100)
    assert cut and max(len(line) for line in text.split("\n")) == 100 and text.endswith("\u2026")
    table, cut = display.fit("a" * 120 + " b c", 100, wrap=False)
    assert cut and table == "a" * 99 + "\u2026"


@pytest.mark.smoke
def test_columns_follow_the_terminal_up_to_100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert display.columns() == 80
    monkeypatch.setenv("COLUMNS", "250")
    assert display.columns() == display.MAX_COLUMNS == 100


@pytest.mark.smoke
def test_a_cut_value_names_the_option_that_prints_it_whole(capsys: pytest.CaptureFixture[str]) -> None:
    display.echo("k: " + "v" * 200, more="--json", wrap=False)
    captured = capsys.readouterr()
    assert len(captured.out.rstrip("\n")) == 100 and "--json prints them whole" in captured.err


@pytest.mark.smoke
def test_a_log_keeps_each_message_whole_unless_columns_says_how_wide(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal, without COLUMNS, a summary or an error is one line (grep); with COLUMNS it wraps."""
    line = "  files: " + ", ".join(f"file_{i}.json" for i in range(20))
    monkeypatch.delenv("COLUMNS", raising=False)
    display.echo(line)
    assert capsys.readouterr().out == line + "\n"
    assert display.message("Error: " + "x " * 80) == "Error: " + "x " * 80
    monkeypatch.setenv("COLUMNS", "100")
    display.echo(line)
    assert len(capsys.readouterr().out.splitlines()) > 1
    assert max(map(len, display.message("Error: " + "x " * 80).splitlines())) <= 100


@pytest.mark.smoke
def test_differences_print_three_significant_digits() -> None:
    assert display.diff(1.043081283569336e-07) == "1.04e-07"
    assert display.diff(0.012345) == "0.0123"


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("hint", "command", "options", "expected"),
    [
        (
            "name it one of text, sentence or pass --text_column",
            "infer",
            {"--input-column"},
            "name it one of text, sentence or pass --input-column",
        ),
        (
            "name it one of label, labels or pass --label_column",
            "evaluate",
            set(),
            "name it one of label, labels",
        ),
        (
            "check the dataset path and its columns (--text_column/--label_column)",
            "evaluate",
            set(),
            "check the dataset path and its columns",
        ),
        (
            "check the dataset path and its columns (--text_column/--label_column)",
            "infer",
            {"--input-column"},
            "check the dataset path and its columns (--input-column)",
        ),
        (
            "export with BatchNorm kept: `modelexport export MODEL --keep-batchnorm`",
            "evaluate",
            set(),
            "export with BatchNorm kept: `modelexport export MODEL --keep-batchnorm`",
        ),
        ("choose --tta-transforms from the list", "pipeline", {"--tta_transforms"}, None),
    ],
)
def test_hints_name_a_flag_of_the_command_that_ran(
    hint: str, command: str, options: set[str], expected: str | None
) -> None:
    want = expected or "choose --tta_transforms from the list"
    assert adapt_hint(hint, command, options) == want


@pytest.mark.smoke
def test_infer_hint_names_input_column_not_the_pipelines_text_column(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], task_export: Any
) -> None:
    data = tmp_path / "d.csv"
    data.write_text("review,score\nnice,1\n")
    out = tmp_path / "p.jsonl"
    model = str(task_export("seq_cls").output_dir)
    assert main(["infer", model, "--data", str(data), "--output", str(out), "--input-column", "body"]) == 1
    err = " ".join(message_lines(capsys.readouterr().err))
    assert "--input-column" in err and "--text_column" not in err


@pytest.mark.smoke
def test_choices_say_did_you_mean_and_list_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quantize", "m.onnx", "-o", "q/", "--mode", "dinamic"]) == 2
    err = " ".join(message_lines(capsys.readouterr().err))
    assert "did you mean 'dynamic'?" in err and "valid: dynamic, static" in err


@pytest.mark.smoke
def test_an_unknown_level_is_named_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """click read ``-O5`` as ``-O`` with the value 5 ("No such option '-O'")."""
    assert main(["optimize", "m.onnx", "-o", "o/", "-O5"]) == 2
    err = capsys.readouterr().err
    assert "No such option '-O5'" in err and "-O1, -O2, -O3, -O4" in err


@pytest.mark.smoke
def test_a_mistyped_task_fails_before_the_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    assert main(["export", "no/such-model", "out/", "--task", "text-generation-with-pass"]) == 1
    err = " ".join(message_lines(capsys.readouterr().err))
    assert "did you mean 'text-generation-with-past'?" in err and "image-classification" in err
    assert "no/such-model" not in err and time.perf_counter() - start < 5  # the model was never looked up


@pytest.mark.smoke
def test_providers_suggest_cuda_for_gpu_in_100_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["profile", "m.onnx", "--ep", "gpu"]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'cuda'?" in err and max(len(line) for line in err.splitlines()) <= 100


@pytest.mark.smoke
def test_quiet_by_default_third_party_only_with_debug() -> None:
    assert main(["metadata", "--help"]) == 0
    assert logging.getLogger().level == logging.ERROR  # other libraries' warnings hidden
    assert logging.getLogger("modelexport").level == logging.WARNING
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what the CLI changes, restored by catch_warnings
        assert main(["metadata", "--help"]) == 0
        warnings.warn_explicit("a library's notice", UserWarning, "lib.py", 1, module="some_library")
        warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="modelexport.x")
    assert [str(w.message) for w in caught] == ["ours"]
    assert main(["--log-level", "info", "--debug", "metadata", "--help"]) == 0
    assert logging.getLogger().level == logging.INFO


@pytest.mark.smoke
def test_progress_off_a_terminal_is_a_few_lines_after_a_delay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelexport._stages import StageLog

    with display.progress("quick"):
        pass
    assert capsys.readouterr().err == ""  # a quick command prints nothing
    monkeypatch.setattr(display, "PROGRESS_DELAY_S", 0.05)
    with display.progress("export m"):
        log = StageLog()
        with log.stage("load"):
            time.sleep(0.2)
        with log.stage("capture"):
            pass
    assert capsys.readouterr().err.splitlines() == ["export m: load", "export m: capture"]


@pytest.mark.smoke
def test_line_progress_writes_whole_lines_not_carriage_returns(capsys: pytest.CaptureFixture[str]) -> None:
    from modelexport import _progress

    bar = _progress.progress_bar(total=3, desc="train epoch 1/2", unit="batch", leave=True)
    assert isinstance(bar, _progress.LineProgress)  # stderr is not a terminal under pytest
    with bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("train epoch 1/2: 3/3 batch in ")


@pytest.mark.smoke
def test_poor_quantization_is_one_line_with_what_to_try() -> None:
    class Static:
        mode, per_channel = "static", False

    class Dynamic:
        mode, per_channel = "dynamic", False

    good = {"mean_cosine": 0.991, "speedup": 2.1}
    assert quantization_advice(good, Dynamic()) is None
    line = quantization_advice({"mean_cosine": 0.715, "speedup": 0.14}, Static())
    assert (
        line and "cosine 0.715 < 0.95" in line and "0.14x" in line and "--mode dynamic --per-channel" in line
    )
    assert "--per-channel" in (quantization_advice({"mean_cosine": 0.9, "speedup": 2.0}, Dynamic()) or "")
    int4 = quantization_advice({"mean_cosine": 0.9, "speedup": 2.0}, WeightOnlyConfig()) or ""
    assert "--mixed-precision norm_inputs" in int4 and len(f"Warning: {int4}") <= 100
    slow = quantization_advice({"mean_cosine": 0.999, "speedup": 0.3}, Dynamic()) or ""
    assert "optimize -O2" in slow and len(f"Warning: {slow}") <= 100


@pytest.mark.smoke
def test_click_usage_errors_fit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["export", "--exporter", "dynamoo", "m", "o"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'dynamo'?" in err and max(map(len, err.splitlines())) <= 100


@pytest.mark.smoke
def test_export_counts_modules_as_analyze_and_report_do(
    tiny_bert_export: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelexport import analyze

    shown = len(analyze(tiny_bert_export.onnx_path).modules)
    assert tiny_bert_export.coverage["modules"] == shown > tiny_bert_export.coverage["unique_tags"]
    assert main(["report", str(tiny_bert_export.output_dir), "-o", str(tmp_path) + "/"]) == 0
    assert f"({shown} modules" in capsys.readouterr().out
