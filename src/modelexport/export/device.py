"""``dtype=`` and ``device=``: where and in which precision PyTorch runs the model for capture.

The model is cast (floating-point weights only; integer buffers stay) and moved before the reference
run, so the captured graph, the reference outputs and the parity check are all in the export dtype.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .config import ExportConfig, InputSpec
from .inputs import ExampleInputs

if TYPE_CHECKING:
    import torch

__all__ = ["check_device", "place_model", "place_inputs"]


def check_device(device: str) -> None:
    """Refuse a CUDA device that is not there, before anything is loaded."""
    if not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        raise ConfigError(
            f"device {device!r} requested, but PyTorch sees {count} CUDA device(s)"
            + ("" if torch.version.cuda else " (this PyTorch build has no CUDA support)"),
            hint="export with --device cpu (the default)",
        )


def _changes(cfg: ExportConfig) -> bool:
    return cfg.dtype != "float32" or cfg.device != "cpu"


def place_model(module: torch.nn.Module, cfg: ExportConfig) -> torch.nn.Module:
    """The model on ``cfg.device`` with floating-point weights in ``cfg.dtype`` (in place, as ``.to`` does)."""
    if not _changes(cfg):
        return module
    import torch

    return module.to(device=torch.device(cfg.device), dtype=getattr(torch, cfg.dtype))


def place_inputs(inputs: ExampleInputs, cfg: ExportConfig) -> ExampleInputs:
    """The example inputs on ``cfg.device``; floating-point ones in ``cfg.dtype`` (integer ids stay)."""
    if not _changes(cfg):
        return inputs
    import torch

    dtype = getattr(torch, cfg.dtype)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=torch.device(cfg.device), dtype=dtype if t.is_floating_point() else t.dtype)

    def spec(s: InputSpec) -> InputSpec:
        floating = s.dtype.startswith(("float", "bfloat"))
        return replace(s, dtype=cfg.dtype) if floating else s

    return replace(
        inputs,
        specs=tuple(spec(s) for s in inputs.specs),
        tensors={k: move(v) for k, v in inputs.tensors.items()},
    )
