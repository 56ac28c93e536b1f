"""Reliable entropy minimisation for real streams (after EATA, Niu et al. 2022, and SAR, Niu et al. 2023).

Tent updates the BN affine parameters on every test example with batch statistics; on a class-sorted stream or
at batch size 1 those statistics and that gradient describe one class, and the model collapses. This method
keeps Tent's torch path (:class:`~.interpreter.OnnxTorchModule`) but:

- normalises with the robust BN statistics of the policy (source prior ``bn_prior`` and/or the stream's
  running statistics), never with one batch's alone, so it works at batch size 1;
- learns only from reliable, non-redundant examples: entropy below ``reliable_entropy * log C`` (EATA's
  0.4) and a softmax not within cosine ``REDUNDANT_COSINE`` of the stream's moving average of the
  examples it learned from (EATA's redundancy filter -- on a class-sorted stream the rest of a class is
  redundant), each weighted by ``exp(margin - entropy)``;
- takes a sharpness-aware step (SAM, radius ``SAM_RHO``: SAR's flat-minimum update) with an L2 anchor to the
  source parameters (``ANCHOR``; EATA's Fisher regulariser with an identity Fisher, as no source data exists
  at test time);
- resets on collapse through the engine's :class:`~.streams.CollapseGuard`, like every method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .adapt import BNAdapter, BNState
from .interpreter import OnnxTorchModule
from .tent import Adam

if TYPE_CHECKING:
    import torch

__all__ = ["ANCHOR", "REDUNDANT_COSINE", "SAM_RHO", "sar_adapt", "sar_step"]

#: SAM neighbourhood radius (SAR's default).
SAM_RHO = 0.05
#: Examples whose softmax is closer than this (cosine) to the stream's moving average are skipped.
REDUNDANT_COSINE = 0.95
#: L2 pull of the adapted BN affine parameters towards the source values.
ANCHOR = 1.0
#: Moving-average rate of the learned-from softmax (EATA's 0.1).
EMA = 0.1


def _reliable(logits: torch.Tensor, margin: float, memory: dict[str, np.ndarray]) -> torch.Tensor:
    """Mask of the reliable, non-redundant rows; the moving average learns from them."""
    import torch

    probs = logits.detach().softmax(dim=-1)
    ent = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
    keep = ent < margin
    average = memory.get("probs")
    if average is not None:
        ref = torch.from_numpy(average).to(probs.dtype)
        keep &= torch.nn.functional.cosine_similarity(probs, ref[None], dim=-1) < REDUNDANT_COSINE
    if bool(keep.any()):
        mean = probs[keep].mean(dim=0).numpy()
        memory["probs"] = mean if average is None else (1.0 - EMA) * average + EMA * mean
    return keep


def _weighted_entropy(logits: torch.Tensor, keep: torch.Tensor, margin: float) -> torch.Tensor:
    """EATA's loss: entropy of the kept rows weighted by exp(margin - entropy), averaged over the batch."""
    import torch

    log_p = logits.log_softmax(dim=-1)
    ent = -(log_p.exp() * log_p).sum(dim=-1)[keep]
    return (torch.exp(margin - ent.detach()) * ent).sum() / len(keep)


def _anchor(params: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> torch.Tensor:
    return ANCHOR * sum(((p - source[n]) ** 2).sum() for n, p in params.items())


def sar_adapt(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    stats: BNState,
    *,
    reliable_entropy: float,
    learning_rate: float,
    steps: int,
    memory: dict[str, np.ndarray],
) -> BNState:
    """``stats``: the robust BN state to normalise with; returns it with updated BN scale/bias (every BN
    layer, through the whole graph: the batch-statistics path)."""
    import torch

    module = OnnxTorchModule(adapter.source, stats, train_bn=False)
    params = module.parameters
    source = {n: torch.from_numpy(np.array(adapter.source_state[n])).float() for n in params}
    tfeeds = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
    sar_step(lambda: module(tfeeds)[0], params, source, reliable_entropy, learning_rate, steps, memory)
    out = dict(stats)
    for name, p in params.items():
        out[name] = p.detach().numpy().astype(stats[name].dtype)
    return out


def sar_step(
    forward: Callable[[], torch.Tensor],
    params: dict[str, torch.Tensor],
    source: dict[str, torch.Tensor],
    reliable_entropy: float,
    learning_rate: float,
    steps: int,
    memory: dict[str, np.ndarray],
) -> None:
    """``steps`` reliable, sharpness-aware, anchored steps of ``params`` (torch parameters, updated in place)
    on the logits ``forward()`` computes from them; ``source``: the values the anchor pulls towards."""
    import torch

    names = list(params)
    tensors = [params[n] for n in names]
    opt = Adam(tensors, learning_rate)
    with torch.enable_grad():
        for _ in range(steps):
            logits = forward()
            margin = reliable_entropy * float(np.log(logits.shape[-1]))
            keep = _reliable(logits, margin, memory)
            if not bool(keep.any()):
                break
            grads = torch.autograd.grad(_weighted_entropy(logits, keep, margin), tensors, allow_unused=True)
            grads = tuple(
                torch.zeros_like(p) if g is None else g for p, g in zip(tensors, grads, strict=True)
            )
            norm = torch.sqrt(sum((g**2).sum() for g in grads)) + 1e-12
            eps = [SAM_RHO * g / norm for g in grads]
            with torch.no_grad():  # climb to the sharpest neighbour, take its gradient there, come back
                for p, e in zip(tensors, eps, strict=True):
                    p.add_(e)
            loss = _weighted_entropy(forward(), keep, margin) + _anchor(params, source)
            sharp = torch.autograd.grad(loss, tensors, allow_unused=True)
            with torch.no_grad():
                for p, e in zip(tensors, eps, strict=True):
                    p.sub_(e)
            opt.step(list(sharp))
