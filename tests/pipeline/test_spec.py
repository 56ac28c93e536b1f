"""The seed's pipeline as its specification writes it (issue 29): the sample command, transform names,
boolean flags, explicit settings against the policy search, every test-time method, --help, majority class."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import modelexport
from modelexport.cli.app import main
from modelexport.cli.pipeline import pipeline_cmd
from modelexport.train.networks import NETWORKS
from modelexport.workflow import PipelineConfig, PipelineResult, run_pipeline
from modelexport.workflow.report import CHOSEN_BY_SEARCH, SET_BY_USER, check_report
from tests.pipeline.test_pipeline import write_digit_folder

ROOT = Path(__file__).resolve().parents[2]
#: The specification's sample, word for word (``--base_model`` is added where a test needs it fast).
SAMPLE = [
    "--model_type", "text_classifier", "--dataset_path", "train_data.csv", "--output_model", "classifier.onnx",
    "--tta", "true", "--tta_transforms", "identity,flip", "--ttt", "false", "--ttt_iterations", "5",
    "--quantize", "dynamic", "--ep", "CUDAExecutionProvider", "--batch_size", "32", "--learning_rate", "2e-5",
    "--epochs", "5", "--log_level", "INFO",
]  # fmt: skip


def parse(args: list[str], **extra: Any) -> PipelineConfig:
    """The options as the command line gives them to the run (click's own parsing, then the config)."""
    ctx = pipeline_cmd.make_context("pipeline", list(args))
    return PipelineConfig(**ctx.params, **extra)


def _one_epoch_run(data: Path, tmp_path: Path, *options: str) -> PipelineResult:
    """The pipeline on ``data`` for one epoch and one search iteration into ``tmp_path/pkg``, with ``options``."""
    base = ["--dataset_path", str(data), "--output_model", str(tmp_path / "pkg"), "--epochs", "1"]
    return run_pipeline(parse([*base, "--iterations", "1", *options], progress=False))


def write_reviews(path: Path, rows: int, positive_share: float = 0.5) -> Path:
    """A text CSV like the specification's train_data.csv (text,label)."""
    good = ["great movie", "loved it", "wonderful acting", "a joy to watch", "brilliant and moving"]
    bad = ["terrible film", "hated it", "awful acting", "a waste of time", "boring and dull"]
    n_pos = int(rows * positive_share)
    lines = [f"{good[i % 5]} {i},positive" for i in range(n_pos)]
    lines += [f"{bad[i % 5]} {i},negative" for i in range(rows - n_pos)]
    path.write_text("text,label\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def small_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digit_folder(tmp_path_factory.mktemp("spec_digits") / "imgs", per_class=16)


# -- 1. the sample command, transform names -------------------------------------------------------------


@pytest.mark.must
def test_flip_and_rotate_are_the_image_transforms_they_mean() -> None:
    cfg = parse(["--tta_transforms", "identity,flip,rotate"])
    assert cfg.tta_transforms == ("identity", "hflip", "rot90") and cfg.tta is True


@pytest.mark.must
def test_sample_with_flip_on_text_stops_before_training_naming_the_text_transforms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_text_base: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    write_reviews(tmp_path / "train_data.csv", 40)
    assert main(["pipeline", *SAMPLE, "--base_model", str(tiny_text_base)]) == 1
    err = capsys.readouterr().err
    error = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "'flip'" in error[0] and "text_classifier" in error[0]
    assert "identity, word_dropout, word_swap" in error[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "train_data.csv"
    ]  # nothing trained, nothing written


@pytest.mark.smoke
@pytest.mark.integration
def test_sample_with_a_text_transform_runs_beside_its_csv_and_says_it_fell_back_to_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_text_base: Path
) -> None:
    """The sample as written (its CSV in the working directory, CUDA asked for) with the text transform
    word_dropout for flip, on the tiny BERT base and 1 epoch to stay fast."""
    monkeypatch.chdir(tmp_path)
    write_reviews(tmp_path / "train_data.csv", 60)
    args = [a if a != "identity,flip" else "identity,word_dropout" for a in SAMPLE]
    args[args.index("--epochs") + 1] = "1"
    rc = main(["pipeline", *args, "--base_model", str(tiny_text_base), "--iterations", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    text = re.sub(r"\s+", " ", out.out + out.err)  # a terminal wraps the line
    assert len(re.findall(r"falling back to CPUExecutionProvider", text)) == 1, text
    report = check_report(json.loads((tmp_path / "pipeline_report.json").read_text()))
    assert report["inference"]["provider"] == "CPUExecutionProvider"
    policy = report["test_time"]["policy"]
    assert policy["tta_transforms"] == ["identity", "word_dropout"] and policy["ttt"] == "none"
    assert (tmp_path / "classifier.onnx").is_file() and (tmp_path / "classifier_dynamic.onnx").is_file()


@pytest.mark.slow
def test_the_sample_command_as_written_on_the_real_encoder(tmp_path: Path) -> None:
    """``python pipeline.py`` exactly as the specification writes it (MiniLM, 5 epochs, 600 rows): one line,
    naming flip and the text transforms; with word_dropout it trains, exports, quantizes and reports."""
    write_reviews(tmp_path / "train_data.csv", 600)
    run = subprocess.run(
        [sys.executable, str(ROOT / "pipeline.py"), *SAMPLE], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 1 and "'flip'" in run.stderr and "word_dropout" in run.stderr
    args = [a if a != "identity,flip" else "identity,word_dropout" for a in SAMPLE]
    run = subprocess.run(
        [sys.executable, str(ROOT / "pipeline.py"), *args], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "falling back to CPUExecutionProvider" in re.sub(r"\s+", " ", run.stdout)
    report = json.loads((tmp_path / "pipeline_report.json").read_text())
    assert report["training"]["val_accuracy"] > report["training"]["majority_class_rate"]


# -- 2. flags and spellings -------------------------------------------------------------------------------


@pytest.mark.must
@pytest.mark.parametrize(
    "args,expected",
    [
        (["--tta", "--tta_transforms", "identity,brightness,contrast", "--ttt"], (True, True, "bn")),
        (["--tta", "false", "--ttt", "false"], (False, False, "bn")),
        (["--tta-transforms", "identity,hflip", "--ttt", "tent", "--quantize", "none"], (True, True, "tent")),
        (["--tta", "--ttt", "sar", "--quantize", "none"], (True, True, "sar")),
        (["--ttt", "--tta"], (True, True, "bn")),
        ([], (None, None, "bn")),
    ],
)
def test_booleans_as_flags_and_both_spellings(args: list[str], expected: tuple[Any, ...]) -> None:
    cfg = parse(args)
    assert (cfg.tta, cfg.ttt, cfg.ttt_method) == expected
    if "identity,brightness,contrast" in args:
        assert cfg.tta_transforms == ("identity", "brightness", "contrast")


@pytest.mark.must
def test_optimize_policy_flag_and_dash_spelling() -> None:
    assert parse(["--optimize-policy", "false"]).optimize_policy is False
    assert parse(["--optimize_policy"]).optimize_policy is True
    assert parse(["--mc-dropout", "4", "--ttt-iterations", "3", "--quantize", "none"]).mc_dropout == 4
    assert parse([]).anchors is True and parse(["--anchors", "false"]).anchors is False


# -- 5. --help true to the code ---------------------------------------------------------------------------


def _defaults_printed() -> dict[str, str]:
    """Each option's ``[default: X]`` as ``--help`` prints it (click's help record of the option)."""
    ctx = pipeline_cmd.make_context("pipeline", [], resilient_parsing=True)
    out = {}
    for param in pipeline_cmd.params:
        record = param.get_help_record(ctx)
        found = re.findall(r"\[default: ([^\]]+)\]", re.sub(r"\s+", " ", record[1])) if record else []
        if found:
            out[param.name] = found[-1].strip()
    return out


@pytest.mark.must
def test_help_prints_the_defaults_the_run_uses() -> None:
    """Every ``[default: X]`` is what an unset option becomes: fixed ones against the config, the per-model
    ones against a config built for each model type, the open test-time ones as left to the search."""
    printed = _defaults_printed()
    default = PipelineConfig()
    for param in pipeline_cmd.params:
        if getattr(param, "show_default", False) and hasattr(default, param.name):
            used = getattr(default, param.name)
            used = ",".join(used) if isinstance(used, tuple) else str(used)
            assert used.lower() == printed[param.name].lower(), param.name
    for name in ("epochs", "learning_rate", "batch_size"):
        values = dict(reversed(p.strip().split(" ")) for p in printed[name].split(","))
        assert set(values) == set(NETWORKS)
        for model_type, value in values.items():
            used = getattr(PipelineConfig(model_type=model_type, dataset_path="sklearn:digits"), name)
            assert float(value) == used, (name, model_type)
    for name in ("tta", "tta_transforms", "tta_aggregate", "ttt", "mc_dropout", "ensemble"):
        assert "search" in printed[name], name
    assert default.user_set == () and default.search_space().fixed == ()
    assert default.search_space().mc_dropout == int(re.search(r"\d+", printed["mc_dropout"]).group())
    assert printed["ttt_iterations"] == "1" and default.search_space().ttt_candidates()[0].ttt_iterations in (
        None,
        1,
    )


@pytest.mark.must
def test_usage_line_names_the_command_typed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "--help"]) == 0
    assert capsys.readouterr().out.startswith("Usage: modelexport pipeline [OPTIONS]")
    run = subprocess.run(
        [sys.executable, str(ROOT / "pipeline.py"), "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.startswith("Usage: python pipeline.py [OPTIONS]")
    run = subprocess.run(
        [sys.executable, str(ROOT / "pipeline.py"), "--quantize", "int4"], capture_output=True, text=True
    )
    assert run.returncode == 2 and "Try 'python pipeline.py --help'" in run.stderr


# -- 3 and 4. explicit settings run; the search decides the rest; every method ----------------------------


@pytest.mark.must
@pytest.mark.integration
def test_explicit_settings_run_as_set_with_the_int8_ensemble(small_digits: Path, tmp_path: Path) -> None:
    """Every test-time setting given: the search does not run and the report says "set by user" for each;
    TTA with flip, BN with 2 passes of batch statistics and the fp32 + int8 ensemble."""
    result = _one_epoch_run(
        small_digits, tmp_path,
        "--tta", "--tta_transforms", "identity,flip", "--tta_aggregate", "mean",
        "--ttt", "bn", "--ttt_iterations", "2", "--mc_dropout", "0", "--ensemble", "int8",
    )  # fmt: skip
    t = result.report["test_time"]
    policy = t["policy"]
    assert policy["tta_transforms"] == ["identity", "hflip"] and policy["tta_aggregate"] == "mean"
    assert (policy["ttt"], policy["statistics"], policy["ttt_iterations"]) == ("bn", "batch", 2)
    assert t["settings"]["ensemble"]["value"] == "fp32 + int8"
    assert result.program.ensemble == (str(result.model_path),)  # the int8 model served with its fp32 twin
    from PIL import Image

    # the package serves it so too: the deployed model names its twin in its metadata
    pipe = modelexport.pipeline(model=str(result.config.package_dir))
    assert [m.name for m in pipe.ensemble] == ["model.onnx"] and pipe.policy.ttt == "bn"
    out = pipe([Image.fromarray(img[:, :, 0]) for img in result.val.images[:8]])
    assert len(out) == 8
    assert modelexport.pipeline(model=str(result.quantized_path), test_time_policy=False).ensemble == []
    for name in ("tta", "tta_transforms", "tta_aggregate", "ttt", "ttt_iterations", "mc_dropout", "ensemble"):
        assert t["settings"][name]["source"] == SET_BY_USER, name
    assert "policy_search" not in result.details


@pytest.mark.must
@pytest.mark.integration
def test_mc_dropout_as_set(small_digits: Path, tmp_path: Path) -> None:
    result = _one_epoch_run(
        small_digits, tmp_path,
        "--quantize", "none", "--tta", "false", "--ttt", "false", "--mc_dropout", "4",
        "--ensemble", "none",
    )  # fmt: skip
    assert result.report["test_time"]["policy"]["mc_dropout"] == 4 and result.program.policy.mc_dropout == 4
    assert result.report["test_time"]["settings"]["mc_dropout"]["source"] == SET_BY_USER


@pytest.mark.must
@pytest.mark.integration
def test_the_search_decides_only_what_was_left_open(small_digits: Path, tmp_path: Path) -> None:
    """--tta with its transforms fixed and --ttt false: every candidate keeps TTA on with those transforms and
    no adaptation (plain inference is measured, never chosen); MC dropout is a candidate; each open setting
    says why the search chose it."""
    result = _one_epoch_run(
        small_digits, tmp_path,
        "--quantize", "none", "--tta", "true", "--tta_transforms", "identity,rotate",
        "--ttt", "false",
    )  # fmt: skip
    t = result.report["test_time"]
    assert t["policy"]["tta_transforms"] == ["identity", "rot90"] and t["policy"]["ttt"] == "none"
    search = result.details["policy_search"]
    assert all(c["policy"]["ttt"] == "none" for c in search["trials"])
    assert any(c["policy"]["mc_dropout"] for c in search["trials"])  # MC dropout was a candidate
    assert t["settings"]["tta"]["source"] == SET_BY_USER and t["settings"]["ttt"]["source"] == SET_BY_USER
    for name in ("tta_aggregate", "mc_dropout", "ensemble"):
        assert t["settings"][name]["source"].startswith(CHOSEN_BY_SEARCH + ": "), name
    assert "not a candidate" in t["settings"]["ensemble"]["source"]  # --quantize none: no int8 twin


@pytest.mark.must
@pytest.mark.integration
def test_pipeline_tent_takes_ttt_iterations_and_learning_rate(small_digits: Path, tmp_path: Path) -> None:
    result = _one_epoch_run(
        small_digits, tmp_path,
        "--quantize", "none", "--tta", "false", "--ttt", "tent", "--ttt_iterations", "3",
        "--learning_rate", "0.002", "--mc_dropout", "0", "--ensemble", "none",
    )  # fmt: skip
    policy = result.report["test_time"]["policy"]
    assert (policy["ttt"], policy["ttt_iterations"], policy["learning_rate"]) == ("tent", 3, 0.002)
    assert result.program.policy.ttt == "tent"


@pytest.mark.must
@pytest.mark.parametrize(
    "args,message",
    [
        (["--ttt", "tent"], "--quantize none"),
        (["--ensemble", "int8", "--quantize", "none"], "int8 twin"),
        (["--model_type", "text_classifier", "--ttt", "sar", "--quantize", "none"], "BatchNorm"),
        (["--mc_dropout", "1", "--quantize", "none"], "mc_dropout"),
        (["--mc_dropout", "4"], "--quantize none"),
    ],
)
def test_test_time_options_are_checked_before_any_work(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["pipeline", *args, "--output_model", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


# -- 6. majority class ------------------------------------------------------------------------------------


@pytest.mark.must
@pytest.mark.integration
def test_a_run_at_the_majority_class_rate_says_so(
    tmp_path: Path, tiny_text_base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 70/30 text set and a learning rate too small to move the tiny encoder: the model predicts one class,
    so validation accuracy is at or below 0.7; the summary and the report say so."""
    data = write_reviews(tmp_path / "d.csv", 60, positive_share=0.7)
    rc = main(
        ["pipeline", "--model_type", "text_classifier", "--dataset_path", str(data), "--base_model",
         str(tiny_text_base), "--output_model", str(tmp_path / "pkg"), "--epochs", "1", "--learning_rate",
         "1e-9", "--quantize", "none", "--iterations", "1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads((tmp_path / "pkg" / "pipeline_report.json").read_text())
    training = report["training"]
    assert 0.6 <= training["majority_class_rate"] <= 0.8
    assert training["val_accuracy"] <= training["majority_class_rate"] and training["at_or_below_majority"]
    assert "Warning: validation accuracy" in re.sub(r"\s+", " ", out) and "majority-class rate" in out


@pytest.mark.must
def test_search_space_keeps_what_the_user_fixed() -> None:
    """The candidates a space allows: fixed settings on (or off) as given, open ones free."""
    from modelexport.testtime.policy import TestTimePolicy
    from modelexport.train.policy_search import PolicySearchSpace

    tent = PolicySearchSpace(ttt_method="tent", ttt_iterations=3, learning_rate=0.002).ttt_candidates()
    assert [(p.ttt, p.ttt_iterations, p.learning_rate) for p in tent] == [("tent", 3, 0.002)]
    batch = PolicySearchSpace(ttt_iterations=2).ttt_candidates()[0]
    assert (batch.statistics, batch.ttt_iterations) == ("batch", 2)
    assert PolicySearchSpace().ttt_candidates()[0].statistics == "memory"
    fixed = PolicySearchSpace(tta=True, ttt=False, fixed=("tta", "ttt"))
    tta = TestTimePolicy(tta_transforms=("identity", "hflip"))
    assert fixed.allows(tta, ()) and not fixed.allows(TestTimePolicy(), ())
    assert not fixed.allows(tta.with_changes(ttt="bn"), ())
    assert fixed.allows(tta.with_changes(mc_dropout=4), ("twin.onnx",))  # open: either way
    assert PolicySearchSpace().allows(TestTimePolicy(), ())  # nothing fixed: plain is a candidate
