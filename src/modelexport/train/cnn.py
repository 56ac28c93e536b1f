"""The image classifier's network: a compact CNN whose BatchNorm layers make BN adaptation possible."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CompactCNN", "ConvBNReLU"]


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
        self, in_channels: int, num_classes: int, image_size: tuple[int, int], width: int = 32
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
