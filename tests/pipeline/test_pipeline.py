"""The end-to-end pipeline: library run, CLI, output layout, metadata policy, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from modelexport.data import load_dataset
from modelexport.workflow import PipelineConfig, run_pipeline
from modelexport.workflow.report import REPORT_KEYS, check_report
from tests.helpers import HAS_OPTIMUM

POLICY_KEY = "modelexport.test_time_policy"


def write_digit_folder(root: Path, per_class: int, offset: int = 0) -> Path:
    """Digits as PNG files, one sub-folder per class (exercises the image-folder reader)."""
    from PIL import Image

    digits = load_dataset("sklearn:digits")
    counts: dict[int, int] = {}
    for i, (img, y) in enumerate(zip(digits.images, digits.labels, strict=True)):
        if i < offset or counts.get(y, 0) >= per_class:
            continue
        counts[y] = counts.get(y, 0) + 1
        (root / str(y)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[:, :, 0]).save(root / str(y) / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digit_folder(tmp_path_factory.mktemp("digits") / "imgs", per_class=40)


@pytest.fixture(scope="module")
def run(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One fast pipeline run: 400 digits, 3 epochs, TTA + BN adaptation search, dynamic int8."""
    out = tmp_path_factory.mktemp("pipeline") / "pkg"
    return run_pipeline(
        dataset_path=str(digits_folder), output_model=str(out), epochs=3, iterations=1, progress=False
    )


@pytest.mark.smoke
@pytest.mark.must
def test_report_has_exactly_the_issue_keys(run: Any) -> None:
    report = check_report(run.report)
    assert set(report) == set(REPORT_KEYS)
    saved = json.loads(run.report_path.read_text())
    assert saved == json.loads(json.dumps(report, default=str))


@pytest.mark.compat
@pytest.mark.smoke
def test_report_values_are_measured(run: Any) -> None:
    r = run.report
    assert r["training"]["val_accuracy"] > 0.5 and r["training"]["epochs_run"] >= 1
    assert r["export"]["hierarchy_coverage"] == 100.0 and r["export"]["parity_max_abs_diff"] < 1e-3
    q = r["quantization"]
    assert q["mode"] == "dynamic" and q["size_bytes_quantized"] < q["size_bytes_fp32"]
    assert q["val_accuracy_quantized"] > 0.5
    assert r["inference"]["provider"] == "CPUExecutionProvider"
    assert r["inference"]["latency_ms_p95"] >= r["inference"]["latency_ms_p50"] > 0
    t = r["test_time"]
    assert t["val_accuracy_with_policy"] >= t["val_accuracy_plain"]
    assert r["config"]["model_type"] == "image_classifier"
    assert r["config"]["tta"] is None and r["config"]["ttt"] is None  # left open: the search decided
    assert all(
        e["source"].startswith("chosen by search: ")
        for n, e in t["settings"].items()
        if n not in ("learning_rate", "iterative", "ttt_iterations")
    )
    assert t["settings"]["ttt_iterations"]["source"].startswith(("chosen by search: ", "default: "))
    trials = run.details["policy_search"]["trials"]
    assert any(c["ensemble"] for c in trials)  # the fp32 + int8 ensemble was tried


@pytest.mark.must
def test_package_layout(run: Any) -> None:
    pkg = run.config.package_dir
    for name in (
        "model.onnx",
        "model_hierarchy.json",
        "model_dynamic.onnx",
        "model_dynamic_hierarchy.json",
        "pipeline_report.json",
    ):
        assert (pkg / name).is_file(), name
    assert run.deployed_path == pkg / "model_dynamic.onnx"
    assert not [p for p in pkg.parent.iterdir() if p.name.startswith(".")], "staging folders left behind"


@pytest.mark.must
@pytest.mark.integration
def test_policy_in_metadata_is_applied_by_modelexport_pipeline(run: Any) -> None:
    import modelexport
    from modelexport.testtime.policy import TestTimePolicy

    for path in (run.model_path, run.quantized_path):
        stored = modelexport.read_metadata(path)[POLICY_KEY]
        assert TestTimePolicy.from_dict(stored) == TestTimePolicy.from_dict(run.report["test_time"]["policy"])
    pipe = modelexport.pipeline(model=str(run.quantized_path))
    from PIL import Image

    images = run.val.images[:40]
    out = pipe([Image.fromarray(img[:, :, 0]) for img in images])
    labels = [o[0]["label"] if isinstance(o, list) else o["label"] for o in out]
    ours = [p.label for p in run.program.predict_batch(images)]
    assert np.mean([a == b for a, b in zip(labels, ours, strict=True)]) >= 0.95


@pytest.mark.integration
def test_image_package_records_its_sources_noise(run: Any) -> None:
    """Both models carry the training images' noise ratio and the denoising strength calibrated on the
    validation images (testtime/denoise.py), which the test-time engine reads."""
    import modelexport
    from modelexport.metadata.schema import KEY_INPUT_NOISE
    from modelexport.testtime.denoise import SHARPEN_STRENGTHS, STRENGTHS, InputNoise

    records = [modelexport.read_metadata(p)[KEY_INPUT_NOISE] for p in (run.model_path, run.quantized_path)]
    assert records[0] == records[1] == run.details["input_noise"]
    record = InputNoise.from_dict(records[0])
    assert 0.1 < record.floor < 0.35  # clean digits: most read 0 (flat borders), rings and loops up to 0.22
    assert record.strength in STRENGTHS and record.examples == min(256, len(run.train))
    assert 0.3 < record.sharp_floor < 1.0 and record.sharpen in SHARPEN_STRENGTHS  # clean digits: 0.64 at p1


@pytest.mark.integration
def test_image_package_records_source_anchors_where_its_calibration_keeps_them(run: Any) -> None:
    """Eight training images per class, as the model takes them, recorded in both models where class-ordered
    streams of noisy validation images gained from them (``calibrate_anchors``; the pipeline's digits
    networks do), and nowhere otherwise (testtime/anchors.py)."""
    import modelexport
    from modelexport.metadata.schema import KEY_SOURCE_ANCHORS
    from modelexport.testtime.anchors import PER_CLASS, SourceAnchors

    decided = run.details["source_anchors"]
    assert decided["examples"] == PER_CLASS * 10
    stored = [
        modelexport.read_metadata(p).get(KEY_SOURCE_ANCHORS) for p in (run.model_path, run.quantized_path)
    ]
    assert stored[0] == stored[1]
    assert (stored[0] is not None) is decided["recorded"]
    if stored[0] is not None:
        anchors = SourceAnchors.from_dict(stored[0])
        assert np.array_equal(np.bincount(anchors.labels), [PER_CLASS] * 10)
        assert anchors.x.ndim == 4 and np.isfinite(anchors.x).all()  # model inputs (N, C, H, W)


@pytest.mark.smoke
@pytest.mark.integration
def test_cli_onnx_path_static_quantization_fixed_policy(
    digits_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output_model dir/clf.onnx``: clf.onnx, clf_static.onnx beside it; a fixed TTA policy reaches inference;
    ``--anchors false`` records no training images."""
    import modelexport
    from modelexport.metadata.schema import KEY_INPUT_NOISE, KEY_SOURCE_ANCHORS
    from modelexport.testtime.policy import TestTimePolicy

    out = tmp_path / "deploy" / "clf.onnx"
    rc = main(
        ["pipeline", "--dataset-path", str(digits_folder), "--output_model", str(out), "--epochs", "1",
         "--quantize", "static", "--tta", "true", "--tta_transforms", "identity,hflip", "--ttt", "false",
         "--optimize_policy", "false", "--iterations", "1", "--log_level", "WARNING", "--report", str(tmp_path / "r.json"),
         "--anchors", "false"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    for name in ("clf.onnx", "clf_hierarchy.json", "clf_static.onnx", "clf_static_hierarchy.json"):
        assert (out.parent / name).is_file(), name
    report = check_report(json.loads((tmp_path / "r.json").read_text()))
    assert report["quantization"]["mode"] == "static"
    policy = TestTimePolicy.from_dict(report["test_time"]["policy"])
    assert policy.tta_transforms == ("identity", "hflip") and policy.ttt == "none"
    assert (
        TestTimePolicy.from_dict(modelexport.read_metadata(out.parent / "clf_static.onnx")[POLICY_KEY])
        == policy
    )
    assert (
        modelexport.pipeline(model=str(out.parent / "clf_static.onnx")).policy.tta_transforms
        == policy.tta_transforms
    )
    assert "Pipeline configuration" in captured.out and "Pipeline report" in captured.out
    # --anchors false: no training images in either model, the input-noise record as always
    for name in ("clf.onnx", "clf_static.onnx"):
        stored = modelexport.read_metadata(out.parent / name)
        assert KEY_SOURCE_ANCHORS not in stored and KEY_INPUT_NOISE in stored, name


@pytest.mark.must
def test_bad_row_names_the_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "d.csv"
    data.write_text("text,label\ngood film,1\nthis row, has, extra fields,0\n")
    out = tmp_path / "out"
    rc = main(
        [
            "pipeline",
            "--model_type",
            "text_classifier",
            "--dataset_path",
            str(data),
            "--output_model",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "line 3" in err and "this row, has, extra fields" in err and "Hint:" in err
    assert not out.exists()


@pytest.mark.must
@pytest.mark.parametrize(
    "args,message",
    [
        (["--dataset_path", "missing.csv"], "dataset not found"),
        (["--ep", "warp-drive"], "unknown execution provider"),
        (["--val_split", "0.9"], "val_split"),
        (["--epochs", "0"], "epochs"),
        (["--ttt_iterations", "0"], "ttt_iterations"),
        (["--tta_transforms", "identity,sideways"], "sideways"),
        (["--tta", "false", "--tta_transforms", "hflip"], "--tta is false"),
        (["--model_type", "text_classifier", "--ttt", "true"], "BatchNorm"),
        (
            ["--base_model", "./no/such/folder", "--model_type", "text_classifier"],
            "base model folder not found",
        ),
    ],
)
def test_bad_options_fail_before_any_work(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    rc = main(["pipeline", *args, "--output_model", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and "Hint:" in err
    assert not out.exists()


@pytest.mark.must
def test_usage_errors_and_dash_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "--tta", "maybe"]) == 2
    assert main(["pipeline", "--quantize", "int4"]) == 2
    capsys.readouterr()
    assert main(["pipeline", "--help"]) == 0
    help_text = capsys.readouterr().out
    for option in ("--model_type", "--dataset_path", "--output_model", "--tta", "--tta_transforms", "--ttt",
                   "--ttt_iterations", "--quantize", "--ep", "--batch_size", "--learning_rate", "--epochs",
                   "--log_level", "--base_model", "--text_column", "--label_column", "--val_split", "--seed",
                   "--iterations", "--tta_aggregate", "--latency_budget_ms", "--optimize_policy", "--report",
                   "--model-type", "--dataset-path", "--output-model"):  # fmt: skip
        assert option in help_text, option


@pytest.mark.must
def test_failure_mid_pipeline_leaves_no_package(
    digits_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quantization failure after training and export: the package folder is never created."""
    import importlib

    from modelexport.errors import OptimizationError

    quantize_module = importlib.import_module("modelexport.workflow.run")  # where the pipeline calls it

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OptimizationError("quantization failed on purpose")

    monkeypatch.setattr(quantize_module, "quantize", broken)
    out = tmp_path / "pkg"
    with pytest.raises(OptimizationError):
        run_pipeline(
            dataset_path=str(digits_folder),
            output_model=str(out),
            epochs=1,
            tta=False,
            ttt=False,
            progress=False,
        )
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.sanity
def test_config_paths() -> None:
    folder = PipelineConfig(output_model="runs/x")
    assert folder.model_file == Path("runs/x/model.onnx") and folder.quantized_file == Path(
        "runs/x/model_dynamic.onnx"
    )
    assert folder.report_file == Path("runs/x/pipeline_report.json")
    file = PipelineConfig(output_model="runs/y/clf.onnx", quantize="static")
    assert file.package_dir == Path("runs/y") and file.quantized_file == Path("runs/y/clf_static.onnx")
    assert PipelineConfig(quantize="none").quantized_file is None
    text = PipelineConfig(model_type="text_classifier", dataset_path="sklearn:digits")
    assert (text.tta, text.ttt, text.learning_rate, text.epochs) == (None, None, 1e-4, 1)
    assert not text.search_space().ttt  # no BatchNorm: no adaptation candidate
    fixed = PipelineConfig(model_type="text_classifier", dataset_path="sklearn:digits", optimize_policy=False)
    assert (fixed.tta, fixed.ttt) == (False, False)  # no search: the model type's defaults


@pytest.mark.smoke
@pytest.mark.integration
@pytest.mark.compat
def test_text_pipeline_package_loads_in_our_pipeline_and_optimum(
    sst2_dir: Path, tiny_text_base: Path, tmp_path: Path
) -> None:
    """48 SST-2 phrases, 1 epoch, tiny BERT base: a regular HF text-classification package."""
    import modelexport

    small = tmp_path / "small.csv"
    small.write_text("".join((sst2_dir / "train.csv").read_text().splitlines(keepends=True)[:61]))
    result = run_pipeline(
        model_type="text_classifier", dataset_path=str(small), base_model=str(tiny_text_base), output_model=str(tmp_path / "txt"),
        epochs=1, batch_size=8, quantize="none", iterations=1, progress=False,
    )  # fmt: skip
    pkg = result.config.package_dir
    config = json.loads((pkg / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and (pkg / "tokenizer.json").is_file()
    assert result.report["quantization"]["size_bytes_quantized"] is None
    report = modelexport.validate_optimum_compatibility(pkg)  # Optimum itself loads it where installed
    assert (
        report.ok if HAS_OPTIMUM else {k for k, ok in report.checks.items() if not ok} == {"ort_model_loads"}
    )
    out = modelexport.pipeline(model=str(pkg))(["a great movie"])
    assert out[0]["label"] == result.program(text="a great movie").label
