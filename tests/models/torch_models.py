"""Small plain-PyTorch models covering the shapes users export: MLP, CNN with BatchNorm, LSTM, reuse."""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "mlp",
    "SmallCNN",
    "LSTMClassifier",
    "Block",
    "ReuseTwice",
    "TwoStages",
    "Shared",
    "SizeBakedNet",
    "TORCH_MODELS",
]


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    """Two conv blocks with BatchNorm, global pooling, a linear head: the shape of our image classifier."""

    def __init__(self, in_channels: int = 1, num_classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(ConvBlock(in_channels, 8), nn.MaxPool2d(2), ConvBlock(8, 16))
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x).mean(dim=(2, 3))))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int = 50, hidden: int = 16, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(input_ids))
        return self.head(out[:, -1])


class Block(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.fc(x)) + x)


class ReuseTwice(nn.Module):
    """One submodule called twice in forward: its call count is 2 and both calls carry its tag."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.block = Block(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(x)))


class TwoStages(nn.Module):
    """Same-class blocks hidden behind plain containers: tags must still be distinct."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.stage1 = nn.Sequential(Block(dim), Block(dim))
        self.stage2 = nn.Sequential(Block(dim), Block(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage2(self.stage1(x))


#: name -> factory; example inputs are inferred from the first layer.
TORCH_MODELS = {
    "mlp": mlp,
    "cnn_bn": SmallCNN,
    "lstm": LSTMClassifier,
    "reuse_twice": ReuseTwice,
    "two_stages": TwoStages,
}


class Shared(nn.Module):
    """Only torch.nn blocks inside a custom root, one of them called twice: tags must not collapse to
    the root (``/Shared/Linear.proj``, ``/Shared/Sequential.mix``)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.mix = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.mix(self.proj(x)))


TORCH_MODELS["shared"] = Shared


class SizeBakedNet(nn.Module):
    """Takes any image size in eager PyTorch, but turns the feature map's size into Python ints: torch.export
    guards on them and TorchScript bakes them in, so no graph of it takes another size. A ``config`` makes
    its input a ``pixel_values`` built as for a Hugging Face image model. Not in ``TORCH_MODELS``."""

    main_input_name = "pixel_values"

    def __init__(self, size: int = 32, patch: int = 8) -> None:
        super().__init__()
        import transformers

        self.config = transformers.PretrainedConfig(image_size=size, num_channels=3)
        self.patch = nn.Conv2d(3, 8, patch, stride=patch)
        self.table = nn.Parameter(torch.randn(1, 8, 3, 3))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixel_values)
        size = (int(x.shape[2]), int(x.shape[3]))
        return x + nn.functional.interpolate(self.table, size=size, mode="bilinear")
