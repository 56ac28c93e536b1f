"""Tiny models for test-time tests: a per-pixel segmenter and an iterative refiner."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PixelSegmenter", "Refiner"]


class PixelSegmenter(nn.Module):
    """1x1 convolutions only: equivariant to flips and rotations, so de-augmented TTA views must agree."""

    def __init__(self, channels: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(channels, 8, 1), nn.ReLU(), nn.Conv2d(8, classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Refiner(nn.Module):
    """One refinement step ``state -> state + 0.5 * tanh(W state + context)``; contracting, so it converges."""

    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        with torch.no_grad():
            self.proj.weight.mul_(0.3)

    def forward(self, state: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return state + 0.5 * torch.tanh(self.proj(state) + context) - 0.5 * state
