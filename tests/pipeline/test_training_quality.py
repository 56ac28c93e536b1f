"""The image pipeline's default training against a plain hand-written torch CNN on a writer-disjoint split.

sklearn's digits in file order: the first 1,200 images train (the pipeline splits off its own validation
set), the other 597 (later writers) are held out. Both models see the same 1,200 images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from modelexport.data import Dataset, load_dataset
from modelexport.inference.evaluate import evaluate
from modelexport.workflow.run import run_pipeline

N_TRAIN = 1200


def _write_folder(root: Path, digits: Dataset, indices: range) -> Path:
    from PIL import Image

    for i in indices:
        (root / str(digits.labels[i])).mkdir(parents=True, exist_ok=True)
        Image.fromarray(digits.images[i][:, :, 0]).save(root / str(digits.labels[i]) / f"{i}.png")
    return root


def _tensors(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.stack(ds.images).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    return torch.from_numpy(x), torch.tensor(ds.labels)


def plain_cnn_accuracy(train: Dataset, test: Dataset, epochs: int = 20, seed: int = 0) -> float:
    """The hand-written baseline: three conv-BN-ReLU blocks, Adam at 1e-2, batches of 64, all 1,200 images."""
    torch.manual_seed(seed)

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(
        block(1, 32), block(32, 32), nn.MaxPool2d(2), block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10),
    )  # fmt: skip
    x, y = _tensors(train)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    xt, yt = _tensors(test)
    with torch.no_grad():
        return float((model(xt).argmax(1) == yt).float().mean())


@pytest.mark.slow
def test_image_pipeline_defaults_match_a_plain_cnn(tmp_path: Path) -> None:
    """Default options (30 cosine epochs, light affine jitter, patience 8), deployed int8 model, plain
    inference: at least the plain CNN's held-out accuracy (0.985 here) and at least 0.98 (measured 0.99;
    0.970 before these defaults). The floor guards against a lucky-low baseline: over seeds 0-2 the plain
    CNN scores 0.95-0.985 (constant learning rate), so the comparison alone would be weak."""
    digits = load_dataset("sklearn:digits")
    train_dir = _write_folder(tmp_path / "train", digits, range(N_TRAIN))
    test_dir = _write_folder(tmp_path / "test", digits, range(N_TRAIN, len(digits)))
    train, test = load_dataset(str(train_dir)), load_dataset(str(test_dir))
    assert (len(train), len(test)) == (1200, 597)
    baseline = plain_cnn_accuracy(train, test)

    result = run_pipeline(
        dataset_path=str(train_dir), output_model=str(tmp_path / "pkg"), iterations=1, progress=False
    )
    deployed = evaluate(result.deployed_path, test).accuracy
    assert not result.details["training"]["stopped_early"]
    assert deployed >= baseline and deployed >= 0.98, (deployed, baseline)
