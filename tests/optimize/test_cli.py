"""``modelexport quantize`` / ``optimize`` through the CLI entry point, good and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelexport.cli.app import main
from tests.helpers import message_lines


@pytest.mark.compat
@pytest.mark.smoke
def test_quantize_cli_prints_summary_with_eval_and_error_report(
    tiny_bert_onnx: Path, bert_npz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q.onnx"
    code = main(
        [
            "quantize",
            str(tiny_bert_onnx),
            "-o",
            str(out),
            "--mode",
            "static",
            "--calibration-data",
            str(bert_npz),
            "--calibration-samples",
            "8",
            "--per-channel",
            "--exclude-modules",
            "*/BertPooler*",
            "--eval-data",
            str(bert_npz),
            "--error-report",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0 and out.is_file()
    assert "hierarchy tags on 100.0%" in text and "nodes quantized per module" in text
    assert "per-module output error" in text and "/BertModel/BertEncoder" in text and "latency" in text


@pytest.mark.smoke
def test_quantize_cli_json(tiny_bert_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["quantize", str(tiny_bert_onnx), "-o", str(tmp_path / "q.onnx"), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["coverage"]["coverage_pct"] == 100.0 and data["settings"]["mode"] == "dynamic"


@pytest.mark.smoke
def test_optimize_cli_prints_fusion_statistics(
    tiny_bert_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.onnx"
    code = main(["optimize", str(tiny_bert_onnx), "-o", str(out), "--transformer-fusion", "--simplify"])
    text = capsys.readouterr().out
    assert code == 0 and out.is_file()
    assert "skip_layer_normalization 4" in text and "hierarchy tags on 100.0%" in text
    assert "skip normalizations split into Add + normalization for the CPU: 4" in text


@pytest.mark.sanity
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["quantize", "{missing}", "-o", "{out}"], "ONNX model not found"),
        (["quantize", "{model}", "-o", "{out}", "--mode", "static"], "needs calibration data"),
        (["quantize", "{model}", "-o", "{out}", "--exclude-modules", "*Nope*"], "matches no module"),
        (
            ["quantize", "{model}", "-o", "{out}", "--mode", "static", "--calibration-data", "{missing}"],
            "not found",
        ),
        (["quantize", "{model}", "-o", "{model}"], "is an input of this run"),
        (["optimize", "{model}", "-o", "{out}", "--level", "none"], "nothing to do"),
        (["optimize", "{missing}", "-o", "{out}"], "ONNX model not found"),
    ],
)
def test_bad_input_gives_one_line_error_hint_and_no_output(
    tiny_bert_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "out.onnx"
    values = {"model": str(tiny_bert_onnx), "out": str(out), "missing": str(tmp_path / "missing.onnx")}
    code = main([a.format(**values) for a in args])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("Error: ") and message in message_lines(err)[0]
    assert "Hint: " in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.sanity
def test_usage_errors_exit_2(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    assert (
        main(
            ["quantize", str(tiny_bert_onnx), "-o", str(tmp_path / "q.onnx"), "--calibrate-method", "median"]
        )
        == 2
    )
    assert main(["optimize", str(tiny_bert_onnx)]) == 2


@pytest.mark.smoke
def test_presets_on_the_command_line(
    tiny_bert_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["optimize", str(tiny_bert_onnx), "-o", str(tmp_path / "o.onnx"), "-O3", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    settings = data["settings"]
    assert code == 0 and data["coverage"]["coverage_pct"] == 100.0
    assert (settings["preset_name"], settings["level"], settings["approximate_gelu"]) == (
        "O3",
        "extended",
        True,
    )
    fusion = next(p for p in data["passes"] if p["name"] == "transformer_fusion")
    assert fusion["stats"]["fused"].get("FastGelu") and fusion["stats"]["matched"]["attention"] == 2
    code = main(
        [
            "quantize",
            str(tiny_bert_onnx),
            "-o",
            str(tmp_path / "q.onnx"),
            "--preset",
            "avx2",
            "--format",
            "json",
        ]
    )
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert code == 0 and (settings["preset_name"], settings["weight_type"], settings["per_channel"]) == (
        "avx2",
        "uint8",
        True,
    )
