"""The image classifier's network and its training-time augmentation (torch ops only, no torchvision)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError

__all__ = ["CompactCNN", "ConvBNReLU", "AffineJitter", "AFFINE_PRESETS"]


class ConvBNReLU(nn.Module):
    """3x3 convolution, BatchNorm, ReLU: the BatchNorm statistics are what BN adaptation updates."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class CompactCNN(nn.Module):
    """Conv-BN-ReLU stages, halving the resolution until it is at most 4x4, then global average pooling.

    BatchNorm makes BN adaptation (test-time training) applicable; pooling keeps the head small.
    """

    def __init__(
        self, in_channels: int, num_classes: int, image_size: tuple[int, int], width: int = 64
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = [ConvBNReLU(in_channels, width), ConvBNReLU(width, width)]
        cin, side = width, min(image_size)
        while side > 4:
            cout = min(cin * 2, 256)
            stages += [nn.MaxPool2d(2), ConvBNReLU(cin, cout)]
            cin, side = cout, side // 2
        self.features = nn.Sequential(*stages)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.features(pixel_values).mean(dim=(2, 3))))


@dataclass(frozen=True)
class AffineJitter:
    """Small random rotation, scale and shift of a training batch: label-preserving for digits, glyphs
    and most photos. No flips: a mirrored digit is another glyph (or none). Edges repeat the border
    pixels, so the background stays the background whatever the normalisation."""

    rotation_deg: float = 5.0
    scale: float = 0.05
    shift: float = 0.125  # fraction of the image side (one pixel of an 8x8 digit)
    probability: float = 1.0  # share of each batch that is transformed

    def __post_init__(self) -> None:
        checks = [
            ("rotation_deg", 0 <= self.rotation_deg <= 45, "in [0, 45]"),
            ("scale", 0 <= self.scale < 0.5, "in [0, 0.5)"),
            ("shift", 0 <= self.shift <= 0.5, "in [0, 0.5]"),
            ("probability", 0 <= self.probability <= 1, "in [0, 1]"),
        ]
        for name, ok, valid in checks:
            if not ok:
                raise ConfigError(f"augmentation {name} must be {valid}, got {getattr(self, name)!r}")

    @property
    def active(self) -> bool:
        return self.probability > 0 and (self.rotation_deg > 0 or self.scale > 0 or self.shift > 0)

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``x`` (N, C, H, W) -> the same shape and dtype, each image warped by its own random affine map."""
        if not self.active or x.shape[0] == 0:
            return x
        n = x.shape[0]

        def uniform(bound: float) -> torch.Tensor:
            return (torch.rand(n, generator=generator) * 2 - 1) * bound

        angle = uniform(math.radians(self.rotation_deg))
        zoom = 1 + uniform(self.scale)
        shift = uniform(2 * self.shift), uniform(2 * self.shift)  # affine_grid spans [-1, 1]: side = 2
        keep = torch.rand(n, generator=generator) >= self.probability
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        theta = torch.stack([torch.stack([cos, -sin, shift[0]], 1), torch.stack([sin, cos, shift[1]], 1)], 1)
        theta[keep] = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        grid = nn.functional.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
        return nn.functional.grid_sample(x, grid, padding_mode="border", align_corners=False)


#: ``none`` turns augmentation off; ``light`` is the image classifier's default.
AFFINE_PRESETS: dict[str, AffineJitter] = {
    "none": AffineJitter(rotation_deg=0.0, scale=0.0, shift=0.0),
    "light": AffineJitter(),
}
