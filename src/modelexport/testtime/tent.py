"""Tent (Wang et al., ICLR 2021): minimise prediction entropy by updating only the BN affine parameters.

The loss's gradient with respect to the logits and Adam are numpy (:func:`tent_step`); a
:data:`~.backprop.Differentiable` carries the gradient back to the parameters. With the source torch model, a
deep copy is adapted (BN layers use batch statistics, everything else stays in eval mode). Without it, the ONNX
graph is run by :class:`~.interpreter.OnnxTorchModule` (operators in ``SUPPORTED_OPS``, ONNX defaults per opset;
an unsupported operator raises a :class:`TestTimeError` naming it) -- or, for the memory statistics' step on the
graph's tail, in numpy where it can (``tail.py``). Updated scale/bias go back into the BN state; the batch
statistics under those parameters are then measured by ONNX Runtime (:class:`BNAdapter`), so prediction runs
there.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import numpy as np

from .._numeric import log_softmax
from ..errors import TestTimeError
from .adapt import BNAdapter, BNState
from .backprop import Differentiable, torch_differentiable
from .interpreter import OnnxTorchModule

if TYPE_CHECKING:
    import torch

__all__ = ["Adam", "entropy_gradient", "tent_adapt", "tent_step", "weighted_entropy_gradient"]


def entropy_gradient(logits: np.ndarray) -> np.ndarray:
    """The gradient of the batch's mean prediction entropy (Tent's loss) with respect to ``logits`` (N, C):
    ``-p (log p + H) / N`` per row."""
    return weighted_entropy_gradient(log_softmax(logits), 1.0)


def weighted_entropy_gradient(
    log_p: np.ndarray,
    weight: np.ndarray | float,
    probs: np.ndarray | None = None,
    entropy: np.ndarray | None = None,
) -> np.ndarray:
    """The gradient, with respect to the logits whose log-probabilities are ``log_p`` (N, C), of the batch's
    mean of each row's prediction entropy times its ``weight`` (held constant; (N, 1) or a scalar);
    ``probs`` (N, C) and ``entropy`` (N, 1): the rows' as the caller computed them (None: computed here)."""
    p = np.exp(log_p) if probs is None else probs
    if entropy is None:
        entropy = -(p * log_p).sum(axis=-1, keepdims=True)
    return weight * -p * (log_p + entropy) / len(log_p)


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
    for m in bns.values():
        m.train()
        m.track_running_stats, m.running_mean, m.running_var = False, None, None
    for p in model.parameters():
        p.requires_grad_(False)
    # the torch parameter each ONNX scale/bias stands for
    torch_names = {}
    for n in bns:
        layer = by_scale[f"{n}.weight"]
        torch_names[layer.scale], torch_names[layer.bias] = f"{n}.weight", f"{n}.bias"
    params = {name: state[name] for name in torch_names}

    def forward(leaves: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, {torch_names[k]: v for k, v in leaves.items()}, (x,))

    return {**state, **tent_step(torch_differentiable(forward), params, lr, steps)}


class Adam:
    """Adam (Kingma & Ba; ``torch.optim.Adam``'s defaults: betas 0.9/0.999, eps 1e-8) over a few numpy arrays,
    in their type: a step's parameters are a few hundred numbers (tested equal to torch's)."""

    def __init__(self, params: dict[str, np.ndarray], lr: float, betas: tuple[float, float] = (0.9, 0.999)):
        self.lr, self.betas, self.t = lr, betas, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The parameters after one update from their gradients (new arrays; ``params`` is not changed)."""
        b1, b2 = self.betas
        self.t += 1
        c1, c2 = 1.0 - b1**self.t, math.sqrt(1.0 - b2**self.t)
        out = {}
        for k, p in params.items():
            g = np.asarray(grads[k], p.dtype)
            m, v = self.m[k], self.v[k]
            m *= b1
            m += (1.0 - b1) * g
            v *= b2
            v += (1.0 - b2) * g * g
            out[k] = p - (self.lr / c1) * m / (np.sqrt(v) / c2 + 1e-8)
        return out


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
    if torch_model is not None:
        if len(feeds) != 1:
            raise TestTimeError("Tent with a torch model supports single-input models; leave torch_model out")
        x = torch.from_numpy(np.asarray(next(iter(feeds.values()))))
        state = _tent_torch_model(torch_model, x, adapter, state, learning_rate, steps)
    else:
        module = OnnxTorchModule(adapter.source, state, train_bn=True)
        tfeeds = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
        differentiable = torch_differentiable(lambda leaves: module({**tfeeds, **leaves})[0])
        params = {name: state[name] for name in module.parameters}
        state.update(tent_step(differentiable, params, learning_rate, steps))
    return adapter.adapt(feeds, prior=state, momentum=1.0, iterations=None)


def tent_step(
    differentiable: Differentiable, params: dict[str, np.ndarray], learning_rate: float, steps: int
) -> dict[str, np.ndarray]:
    """``params`` after ``steps`` Tent updates (Adam on the mean prediction entropy of the logits
    ``differentiable`` computes from them)."""
    opt = Adam(params, learning_rate)
    for _ in range(steps):
        logits, vjp = differentiable(params)
        params = opt.step(params, vjp(entropy_gradient(logits)))
    return params
