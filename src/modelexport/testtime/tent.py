"""Tent (Wang et al., ICLR 2021): minimise prediction entropy by updating only the BN affine parameters.

Gradients need PyTorch. With the source torch model, a deep copy is adapted (BN layers use batch
statistics, everything else stays in eval mode). Without it, the ONNX graph is run by
:class:`~.interpreter.OnnxTorchModule` (operators in ``SUPPORTED_OPS``, ONNX defaults per opset; an
unsupported operator raises a :class:`TestTimeError` naming it). Updated scale/bias go back into the BN state;
the batch statistics under those parameters are then measured by ONNX Runtime (:class:`BNAdapter`), so
prediction runs there.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TestTimeError
from .adapt import BNAdapter, BNState
from .interpreter import OnnxTorchModule

if TYPE_CHECKING:
    import torch

__all__ = ["tent_adapt", "tent_step"]


def _entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    log_p = logits.log_softmax(dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1).mean()


def _tent_torch_model(
    torch_model: torch.nn.Module, x: torch.Tensor, adapter: BNAdapter, state: BNState, lr: float, steps: int
) -> BNState:
    """Tent on a deep copy of the source torch model; BN modules are matched to ONNX BN nodes by name."""
    import torch

    model = copy.deepcopy(torch_model).eval()
    by_scale = {layer.scale: layer for layer in adapter.layers}
    bns = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    if {f"{n}.weight" for n in bns} != set(by_scale):
        raise TestTimeError(
            "cannot match the torch model's BatchNorm modules to the ONNX BatchNormalization nodes by name",
            hint="pass the torch model that was exported, or leave torch_model out to adapt the ONNX graph",
        )
    params = []
    with torch.no_grad():
        for name, m in bns.items():
            layer = by_scale[f"{name}.weight"]
            m.weight.copy_(torch.from_numpy(np.array(state[layer.scale])))
            m.bias.copy_(torch.from_numpy(np.array(state[layer.bias])))
            m.train()
            m.track_running_stats, m.running_mean, m.running_var = False, None, None
    for p in model.parameters():
        p.requires_grad_(False)
    for m in bns.values():
        m.weight.requires_grad_(True)
        m.bias.requires_grad_(True)
        params += [m.weight, m.bias]
    _optimize(lambda: model(x), params, lr, steps)
    out = dict(state)
    for name, m in bns.items():
        layer = by_scale[f"{name}.weight"]
        out[layer.scale] = m.weight.detach().numpy().astype(state[layer.scale].dtype)
        out[layer.bias] = m.bias.detach().numpy().astype(state[layer.bias].dtype)
    return out


class Adam:
    """Adam (Kingma & Ba; ``torch.optim.Adam``'s defaults: betas 0.9/0.999, eps 1e-8) over a few tensors,
    written out: the optimizer object's bookkeeping cost more than a tail step's arithmetic (tested equal)."""

    def __init__(
        self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999)
    ) -> None:
        import torch

        self.params, self.lr, self.betas, self.t = params, lr, betas, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self, grads: list[torch.Tensor | None]) -> None:
        """One update from the gradients (None: a parameter the loss does not reach, left as it is)."""
        import torch

        b1, b2 = self.betas
        self.t += 1
        c1, c2 = 1.0 - b1**self.t, math.sqrt(1.0 - b2**self.t)
        with torch.no_grad():
            for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
                if g is None:
                    continue
                m.mul_(b1).add_(g, alpha=1.0 - b1)
                v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
                p.addcdiv_(m, (v.sqrt() / c2).add_(1e-8), value=-self.lr / c1)


def _optimize(forward: Callable[[], torch.Tensor], params: list[torch.Tensor], lr: float, steps: int) -> None:
    import torch

    opt = Adam(params, lr)
    for _ in range(steps):
        opt.step(list(torch.autograd.grad(_entropy_loss(forward()), params, allow_unused=True)))


def tent_adapt(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    prior: BNState | None = None,
    learning_rate: float = 1e-3,
    steps: int | None = 1,
    torch_model: torch.nn.Module | None = None,
) -> BNState:
    """A BN state after ``steps`` Tent updates on this batch: new scale/bias, then batch statistics under them."""
    import torch

    state = {**adapter.source_state, **(prior or {})}
    steps = 1 if steps is None else steps
    with torch.enable_grad():
        if torch_model is not None:
            if len(feeds) != 1:
                raise TestTimeError(
                    "Tent with a torch model supports single-input models; leave torch_model out"
                )
            x = torch.from_numpy(np.asarray(next(iter(feeds.values()))))
            state = _tent_torch_model(torch_model, x, adapter, state, learning_rate, steps)
        else:
            module = OnnxTorchModule(adapter.source, state, train_bn=True)
            tfeeds = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
            _optimize(lambda: module(tfeeds)[0], list(module.parameters.values()), learning_rate, steps)
            for name, p in module.parameters.items():
                state[name] = p.detach().numpy().astype(state[name].dtype)
    return adapter.adapt(feeds, prior=state, momentum=1.0, iterations=None)


def tent_step(
    forward: Callable[[], torch.Tensor], params: dict[str, torch.Tensor], learning_rate: float, steps: int
) -> None:
    """``steps`` Tent updates of ``params`` (torch parameters, updated in place) on the logits ``forward()``
    computes from them, the statistics held fixed (the memory statistics' Tent)."""
    import torch

    with torch.enable_grad():
        _optimize(forward, list(params.values()), learning_rate, steps)
