"""A CNN with BatchNorm trained on sklearn's digits, and the corrupted test split of the real-data proof."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["DigitsCNN", "DigitsData", "load_digits_data", "train_digits_cnn"]


class DigitsCNN(nn.Module):
    """Three conv blocks with BatchNorm on 8x8 digits, global pooling, dropout, a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(block(1, 16), block(16, 32), nn.MaxPool2d(2), block(32, 32))
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x).mean(dim=(2, 3))))


@dataclass(frozen=True)
class DigitsData:
    x_train: np.ndarray  # (N, 1, 8, 8) float32 in [0, 1]
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits_data(test_fraction: float = 0.25, seed: int = 0) -> DigitsData:
    """sklearn digits scaled to [0, 1], a seeded stratified train/test split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return DigitsData(x_tr, y_tr, x_te, y_te)


def train_digits_cnn(data: DigitsData, epochs: int = 12, seed: int = 0) -> DigitsCNN:
    """A few epochs of Adam; about two seconds on one torch thread (tests/conftest.py sets one)."""
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()
