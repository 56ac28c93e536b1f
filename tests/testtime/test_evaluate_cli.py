"""``modelexport evaluate``: .npz and image-folder data, JSON/table output, baseline, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from modelexport.inference.evaluate import evaluate
from modelexport.testtime import TestTimeEngine, TestTimePolicy

KEYS = {"accuracy", "latency_ms_p50", "latency_ms_p95", "throughput_per_s", "n"}


@pytest.fixture(scope="module")
def digits_npz(digits: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("npz") / "digits_test.npz"
    np.savez(path, x=digits.x_test[:200], y=digits.y_test[:200])
    return path


@pytest.fixture(scope="module")
def digits_folder(digits: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image folder (one sub-folder per class) of 8-bit PNGs written from the test split."""
    from PIL import Image

    root = tmp_path_factory.mktemp("digit_images")
    for i, (img, label) in enumerate(zip(digits.x_test[:120], digits.y_test[:120], strict=True)):
        (root / str(label)).mkdir(exist_ok=True)
        Image.fromarray(np.round(img[0] * 255).astype(np.uint8), mode="L").save(
            root / str(label) / f"{i}.png"
        )
    return root


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.must
def test_evaluate_npz_json_accuracy_is_measured(
    digits_export: Any, digits: Any, digits_npz: Path, capsys: Any
) -> None:
    out = _json(
        capsys,
        [
            "evaluate",
            str(digits_export.output_dir),
            "--data",
            str(digits_npz),
            "--format",
            "json",
            "--baseline",
            "--ttt",
            "bn",
            "--batch-size",
            "50",
        ],
    )
    assert KEYS <= set(out) and out["n"] == 200 and out["baseline"]["n"] == 200
    probs = TestTimeEngine(digits_export.onnx_path).predict({"x": digits.x_test[:200]})
    assert out["baseline"]["accuracy"] == pytest.approx(
        float((probs.argmax(1) == digits.y_test[:200]).mean())
    )
    assert out["accuracy_delta"] == pytest.approx(out["accuracy"] - out["baseline"]["accuracy"], abs=1e-6)
    assert out["latency_ms_p95"] >= out["latency_ms_p50"] > 0 and out["throughput_per_s"] > 0
    assert out["policy"]["ttt"] == "bn"


@pytest.mark.integration
def test_evaluate_image_folder_uses_the_model_processor(
    digits_export: Any, digits: Any, digits_folder: Path
) -> None:
    result = evaluate(
        digits_export.output_dir,
        digits_folder,
        TestTimePolicy(tta_transforms="identity,scale"),
        batch_size=32,
    )
    assert result.n == 120 and result.n_views == 2
    probs = TestTimeEngine(digits_export.onnx_path).predict({"x": digits.x_test[:120]})
    assert result.accuracy >= float((probs.argmax(1) == digits.y_test[:120]).mean()) - 0.05


@pytest.mark.smoke
def test_evaluate_table_and_mc_dropout(digits_export: Any, digits_npz: Path, capsys: Any) -> None:
    assert (
        main(
            [
                "evaluate",
                str(digits_export.onnx_path),
                "--data",
                str(digits_npz),
                "--mc-dropout",
                "4",
                "--tta-transforms",
                "identity,hflip",
                "--tta-threshold",
                "0.9",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert (
        "accuracy" in text
        and "MC dropout mean predictive entropy" in text
        and "adaptive TTA augmented" in text
    )


@pytest.mark.must
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tta-transforms", "identity,mirror"], "image: identity, hflip"),
        (["--tta-aggregate", "avg"], "valid: mean"),
        (["--mc-dropout", "1"], "mc_dropout"),
        (["--ttt", "tent", "--learning-rate", "nan"], "learning_rate must be a finite number > 0, got nan"),
        (["--ttt", "sar", "--learning-rate", "inf"], "learning_rate must be a finite number > 0, got inf"),
        (["--ttt", "bn", "--statistics", "batch", "--bn-prior", "nan"], "bn_prior must be a finite"),
        (["--seed", "-1"], "seed must be an integer in [0, 4,294,967,295], got -1"),
        (["--seed", str(2**64)], f"got {2**64}"),
        (["--ttt", "bn", "--order", "dirichlet:inf"], "dirichlet alpha must be a finite number"),
        (["--ttt", "bn", "--denoise", "nan"], "denoise must be a finite number >= 0"),
        (["--ttt", "bn", "--sharpen", "inf"], "sharpen must be a finite number >= 0"),
    ],
)
def test_bad_options_give_one_line_and_exit_1(
    digits_export: Any, digits_npz: Path, capsys: Any, extra: list[str], message: str
) -> None:
    """Refused before any work (issue 31: NaN learning rates and signed or 65-bit seeds were 'bugs')."""
    assert main(["evaluate", str(digits_export.onnx_path), "--data", str(digits_npz), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and "Hint:" in err and "Traceback" not in err and "looks like a bug" not in err
    assert len([line for line in err.splitlines() if line.startswith("Error:")]) == 1


@pytest.mark.must
def test_bn_adaptation_on_a_model_without_batchnorm(mlp_export: Any, tmp_path: Path, capsys: Any) -> None:
    data = tmp_path / "mlp.npz"
    np.savez(data, x=np.zeros((4, 6), np.float32), y=np.array([0, 1, 2, 0]))
    assert main(["evaluate", str(mlp_export.onnx_path), "--data", str(data), "--ttt", "bn"]) == 1
    err = capsys.readouterr().err
    assert "no BatchNormalization nodes" in err and "--tta-transforms" in err  # an MLP has no BN to keep
    assert "--keep-batchnorm" not in err


@pytest.mark.sanity
def test_missing_data_and_mismatched_classes(
    digits_export: Any, mlp_export: Any, digits_npz: Path, tmp_path: Path, capsys: Any
) -> None:
    assert main(["evaluate", str(digits_export.onnx_path), "--data", str(tmp_path / "nope.npz")]) == 1
    assert "Error:" in capsys.readouterr().err
    assert main(["evaluate", str(mlp_export.onnx_path), "--data", str(digits_npz)]) == 1
    assert "Error:" in capsys.readouterr().err


@pytest.mark.must
def test_evaluate_order_and_stream_are_printed_and_applied(
    digits_export: Any, digits_npz: Path, capsys: Any
) -> None:
    """--ttt bn adapts continually with the memory statistics by default; --statistics batch --episodic is
    the exact per-batch BN whose class-sorted failure the label-shift guard catches."""
    base = ["evaluate", str(digits_export.onnx_path), "--data", str(digits_npz), "--ttt", "bn"]
    default = _json(capsys, [*base, "--order", "class-sorted", "--baseline", "--format", "json"])
    assert (
        default["stream"]
        and default["policy"]["statistics"] == "memory"
        and not default["policy"]["episodic"]
    )
    assert default["accuracy"] >= default["baseline"]["accuracy"] - 0.01 and default["fallbacks"] == 0
    assert main([*base, "--order", "class-sorted"]) == 0
    assert "stream order class-sorted, continual (one stream)" in capsys.readouterr().out
    exact = [*base, "--statistics", "batch", "--episodic"]
    assert main([*exact, "--order", "class-sorted"]) == 0
    assert "episodic (reset per batch)" in capsys.readouterr().out
    unguarded = [*exact, "--label-shift-alpha", "0", "--format", "json"]
    sorted_exact = _json(capsys, [*unguarded, "--order", "class-sorted"])
    shuffled_exact = _json(capsys, [*unguarded, "--order", "shuffle"])
    assert sorted_exact["order"] == "class-sorted" and not sorted_exact["stream"]
    assert sorted_exact["accuracy"] < shuffled_exact["accuracy"] - 0.05  # one-class batches break exact BN
    guarded = _json(capsys, [*exact, "--order", "class-sorted", "--baseline", "--format", "json"])
    assert guarded["fallbacks"] > 0 and guarded["accuracy"] >= guarded["baseline"]["accuracy"] - 0.01
    running = ["--statistics", "batch", "--momentum", "0.05", "--bn-prior", "64", "--prior-correction"]
    corrected = _json(capsys, [*base, "--order", "class-sorted", *running, "--format", "json"])
    assert corrected["policy"]["prior_correction"] and corrected["policy"]["label_shift_alpha"] == 0.001
    assert main([*base, "--momentum", "0.05"]) == 1  # momentum weighs batch statistics
    assert "--statistics batch" in capsys.readouterr().err
    assert main([*base, "--order", "dirichlet:-1"]) == 1
    assert "alpha must be a finite number > 0" in capsys.readouterr().err
