"""Fixtures for quantize/optimize tests: a tiny BERT package, calibration files, the shared digits CNN."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.inference.conftest import task_export, task_source  # noqa: F401 - session fixtures


def bert_feeds(n: int, seq: int = 8, vocab: int = 99, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` samples for the tiny BERT's three inputs (samples on axis 0)."""
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, vocab, (n, seq)).astype(np.int64),
        "attention_mask": np.ones((n, seq), np.int64),
        "token_type_ids": np.zeros((n, seq), np.int64),
    }


@pytest.fixture(scope="session")
def tiny_bert_onnx(tiny_bert_export: Any) -> Path:
    return Path(tiny_bert_export.onnx_path)


@pytest.fixture(scope="session")
def bert_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "bert.npz"
    np.savez(path, **bert_feeds(16))
    return path


@dataclass
class Digits:
    onnx_path: Path
    calib_npz: Path
    test_npz: Path
    torch_accuracy: float


@pytest.fixture(scope="session")
def digits(digits_data: Any, digits_cnn: Any, tmp_path_factory: pytest.TempPathFactory) -> Digits:
    """The shared trained digits CNN (tests/conftest.py) exported plainly (BatchNorm folded, Dropout gone);
    calibration and held-out (450 images) .npz files."""
    import torch

    import modelexport

    with torch.no_grad():
        predicted = digits_cnn(torch.from_numpy(digits_data.x_test)).argmax(-1).numpy()
    acc = float((predicted == digits_data.y_test).mean())
    root = tmp_path_factory.mktemp("digits")
    result = modelexport.export(digits_cnn, root / "pkg", input_shape=(1, 1, 8, 8))
    np.savez(root / "calib.npz", x=digits_data.x_train[:128])
    np.savez(root / "test.npz", x=digits_data.x_test, y=digits_data.y_test)
    return Digits(Path(result.onnx_path), root / "calib.npz", root / "test.npz", acc)


@pytest.fixture(scope="session")
def seq_cls_export(task_export: Any) -> Any:  # noqa: F811 - the imported fixture, by name
    """The tiny BERT sentiment classifier (negative/neutral/positive) of tests/inference, tokenizer beside:
    the same export (one source folder, one cache key) whichever test folder asks first."""
    return task_export("seq_cls")


@pytest.fixture(scope="session")
def sst2_words(sst2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 48 SST-2 dev sentences (lengths differ) with word labels: 0 -> negative, 1 -> positive."""
    import csv

    with (sst2_dir / "dev.csv").open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[:48]
    path = tmp_path_factory.mktemp("sst2_words") / "dev_words.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence", "sentiment"])
        writer.writerows([r["text"], "positive" if r["label"] == "1" else "negative"] for r in rows)
    return path
