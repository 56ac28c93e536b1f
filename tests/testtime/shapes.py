"""A second image dataset built here, and the pipeline's own network trained on it: the test-time proofs
must hold beyond the digits they were tuned on.

Ten classes of outline and filled shapes (disk, ring, square, frame, triangle, triangle outline, plus, cross,
two horizontal bars, two vertical bars), 16x16 grey images, each drawn with its own position, size,
rotation (up to 15 degrees: a plus stays a plus), stroke width, ink and paper level, anti-aliased by 4x
supersampling. Seeded: the same seed gives the same images. The network is :class:`CompactCNN` (the image
pipeline's: conv-BN-ReLU stages to 4x4, global pooling), four BN layers against the digits CNN's three.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from modelexport.train.cnn import CompactCNN

__all__ = ["SHAPES", "ShapesData", "load_shapes_data", "render_shapes", "train_shapes_cnn"]

SIDE = 16
SUPER = 4

#: class -> mask(u, v, r, w): u, v rotated pixel coordinates about the centre, r the size, w the stroke.
Mask = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _triangle(u: np.ndarray, v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Signed distance-like value of an upward triangle (negative inside)."""
    return np.maximum(-v - 0.6 * r, (np.abs(u) * 1.6 + v) - 0.9 * r)


SHAPES: dict[str, Mask] = {
    "disk": lambda u, v, r, w: np.hypot(u, v) < r,
    "ring": lambda u, v, r, w: np.abs(np.hypot(u, v) - 0.75 * r) < w,
    "square": lambda u, v, r, w: np.maximum(np.abs(u), np.abs(v)) < 0.8 * r,
    "frame": lambda u, v, r, w: np.abs(np.maximum(np.abs(u), np.abs(v)) - 0.7 * r) < w,
    "triangle": lambda u, v, r, w: _triangle(u, v, r) < 0,
    "triangle outline": lambda u, v, r, w: np.abs(_triangle(u, v, r)) < w,
    "plus": lambda u, v, r, w: ((np.abs(u) < w) & (np.abs(v) < r)) | ((np.abs(v) < w) & (np.abs(u) < r)),
    "cross": lambda u, v, r, w: (
        (np.abs(u + v) < 1.4 * w) & (np.abs(u - v) < 1.4 * r)
        | (np.abs(u - v) < 1.4 * w) & (np.abs(u + v) < 1.4 * r)
    ),
    "two bars": lambda u, v, r, w: (np.abs(np.abs(v) - 0.4 * r) < w) & (np.abs(u) < r),
    "two columns": lambda u, v, r, w: (np.abs(np.abs(u) - 0.4 * r) < w) & (np.abs(v) < r),
}


def render_shapes(labels: np.ndarray, seed: int) -> np.ndarray:
    """(N, 1, 16, 16) float32 images in [0, 1], one drawing of class ``labels[i]`` each (seeded)."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    grid = (np.arange(SIDE * SUPER) + 0.5) / SUPER - SIDE / 2  # pixel units about the image centre
    y, x = np.meshgrid(grid, grid, indexing="ij")
    cx, cy = rng.uniform(-1.5, 1.5, n), rng.uniform(-1.5, 1.5, n)
    theta = np.deg2rad(rng.uniform(-15, 15, n))
    r, w = rng.uniform(4.0, 6.5, n), rng.uniform(0.8, 1.4, n)
    ink, paper = rng.uniform(0.7, 1.0, n), rng.uniform(0.0, 0.15, n)
    out = np.empty((n, 1, SIDE, SIDE), np.float32)
    names = list(SHAPES)
    for i in range(n):
        dx, dy = x - cx[i], y - cy[i]
        c, s = np.cos(theta[i]), np.sin(theta[i])
        u, v = c * dx + s * dy, -s * dx + c * dy
        mask = SHAPES[names[int(labels[i])]](u, v, r[i], w[i]).astype(np.float32)
        cover = mask.reshape(SIDE, SUPER, SIDE, SUPER).mean(axis=(1, 3))
        out[i, 0] = paper[i] + (ink[i] - paper[i]) * cover
    return out


@dataclass(frozen=True)
class ShapesData:
    x_train: np.ndarray  # (N, 1, 16, 16) float32 in [0, 1]
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_shapes_data(n_train: int = 3000, n_test: int = 1000, seed: int = 0) -> ShapesData:
    """Balanced train and test sets drawn with different seeds."""
    y_train = np.arange(n_train) % len(SHAPES)
    y_test = np.arange(n_test) % len(SHAPES)
    return ShapesData(
        render_shapes(y_train, seed),
        y_train.astype(np.int64),
        render_shapes(y_test, seed + 1),
        y_test.astype(np.int64),
    )


def train_shapes_cnn(data: ShapesData, epochs: int = 8, seed: int = 0, width: int = 16) -> CompactCNN:
    """Adam on the training split; a few seconds on one torch thread."""
    torch.manual_seed(seed)
    model = CompactCNN(1, len(SHAPES), (SIDE, SIDE), width=width)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()
