"""``modelexport evaluate --engine ray``: the local evaluation's accuracy and ``n`` from Ray actors, with and
without a TTA policy applied inside each actor, and the refusals that need no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.batch import evaluate_batch
from modelexport.cli.app import main
from modelexport.errors import ConfigError
from modelexport.inference.evaluate import evaluate
from modelexport.testtime import TestTimePolicy


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 real 8 x 8 digits of classes 0-3 (folders named by class id, what the plain CNN predicts)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    root = tmp_path_factory.mktemp("eval_digits")
    chosen = np.flatnonzero(digits.target < 4)[:60]
    for i in chosen:
        folder = root / str(digits.target[i])
        folder.mkdir(exist_ok=True)
        pixels = np.round(digits.images[i] / 16 * 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{i:04d}.png")
    return root


@pytest.mark.slow  # ~30 s of Ray actors; the default run keeps Ray's infer tests (image, text, killed worker)
@pytest.mark.integration
def test_ray_evaluate_matches_local_with_and_without_tta(
    ray_cluster: Any, cnn_export: Any, digit_folder: Path, capsys: Any
) -> None:
    model = str(cnn_export.output_dir)
    policy = TestTimePolicy(tta_transforms="identity,hflip")
    local = evaluate(model, digit_folder, policy, batch_size=8, baseline=True)
    argv = ["evaluate", model, "--data", str(digit_folder), "--tta-transforms", "identity,hflip"]
    argv += ["--baseline", "--batch-size", "8", "--engine", "ray", "--num-workers", "2", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    for got, want in ((out, local), (out["baseline"], local.baseline)):
        assert (got["accuracy"], got["n"]) == (want.accuracy, want.n)
        assert got["n_views"] == want.n_views
        assert got["latency_ms_p95"] >= got["latency_ms_p50"] > 0 and got["throughput_per_s"] > 0
        assert got["extra"]["engine"] == "ray" and 1 <= got["extra"]["workers_seen"] <= 2
    assert (out["n"], out["n_views"], out["baseline"]["n_views"]) == (60, 2, 1)


@pytest.mark.smoke
def test_ray_evaluate_refuses_a_continual_stream(cnn_export: Any, digit_folder: Path) -> None:
    with pytest.raises(ConfigError, match="continual adaptation") as info:
        evaluate_batch(cnn_export.output_dir, digit_folder, TestTimePolicy(ttt="bn"), engine="ray")
    assert "--episodic" in info.value.hint
    with pytest.raises(ConfigError, match="num_workers"):
        evaluate_batch(cnn_export.output_dir, digit_folder, engine="ray", num_workers=0)


@pytest.mark.slow
def test_ray_evaluate_text_classification_matches_local(
    ray_cluster: Any, minilm_classifier: Any, sst2_dir: Path, tmp_path: Path
) -> None:
    """40 real SST-2 sentences through the MiniLM tokenizer, tokenized inside the actors: the local accuracy
    and ``n``, with text TTA (the strings augmented in the worker) and without."""
    model = minilm_classifier("tiny")
    data = tmp_path / "sst2.csv"
    data.write_text("\n".join((sst2_dir / "dev.csv").read_text().splitlines()[:41]) + "\n")
    policy = TestTimePolicy(tta_transforms="identity,word_dropout")
    local = evaluate(model, data, policy, batch_size=8, baseline=True)
    result = evaluate_batch(model, data, policy, batch_size=8, baseline=True, num_workers=2)
    for got, want in ((result, local), (result.baseline, local.baseline)):
        assert (got.accuracy, got.n, got.n_views) == (want.accuracy, want.n, want.n_views)
        assert got.extra["engine"] == "ray" and got.throughput_per_s > 0
    assert result.n == 40 and result.n_views == 2 and result.baseline.n_views == 1  # text TTA: 2 views
