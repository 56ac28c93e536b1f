"""Fixtures for quantize/optimize tests: a tiny BERT package, calibration files, a trained digits CNN."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

DIGITS_EPOCHS = 12


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


def _train_digits_cnn(
    epochs: int = DIGITS_EPOCHS,
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from tests.models.torch_models import SmallCNN

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    torch.manual_seed(0)
    model = SmallCNN(in_channels=1, num_classes=10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr).long()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval(), xtr, ytr, xte, yte


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    """SmallCNN trained on sklearn digits (75/25 split), exported; calibration and held-out .npz files."""
    import torch

    import modelexport

    model, xtr, _, xte, yte = _train_digits_cnn()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xte)).argmax(-1).numpy() == yte).mean())
    root = tmp_path_factory.mktemp("digits")
    result = modelexport.export(model, root / "pkg", input_shape=(1, 1, 8, 8))
    np.savez(root / "calib.npz", x=xtr[:128])
    np.savez(root / "test.npz", x=xte, y=yte)
    return Digits(Path(result.onnx_path), root / "calib.npz", root / "test.npz", acc)


@pytest.fixture(scope="session")
def seq_cls_export(export_cache: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny BERT sentiment classifier (negative/neutral/positive) of tests/inference, tokenizer beside."""
    from tests.inference.tiny_tasks import save_task_model

    source = save_task_model("seq_cls", tmp_path_factory.mktemp("src_seq_cls"))
    return export_cache.get("task_seq_cls", str(source))


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
