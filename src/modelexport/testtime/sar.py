"""Reliable entropy minimisation for real streams (after EATA, Niu et al. 2022, and SAR, Niu et al. 2023).

Tent updates the BN affine parameters on every test example with batch statistics; on a class-sorted stream or
at batch size 1 those statistics and that gradient describe one class, and the model collapses. This method
steps as Tent does (a :data:`~.backprop.Differentiable`: the graph in torch, or the memory statistics' tail in
numpy where it can, ``tail.py``) but:

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

import math

import numpy as np

from .._numeric import log_softmax
from .adapt import BNAdapter, BNState
from .backprop import Differentiable, torch_differentiable
from .interpreter import OnnxTorchModule
from .tent import Adam, weighted_entropy_gradient

__all__ = ["ANCHOR", "REDUNDANT_COSINE", "SAM_RHO", "sar_adapt", "sar_step"]

#: SAM neighbourhood radius (SAR's default).
SAM_RHO = 0.05
#: Examples whose softmax is closer than this (cosine) to the stream's moving average are skipped.
REDUNDANT_COSINE = 0.95
#: L2 pull of the adapted BN affine parameters towards the source values.
ANCHOR = 1.0
#: Moving-average rate of the learned-from softmax (EATA's 0.1).
EMA = 0.1


def _reliable(
    probs: np.ndarray, entropy: np.ndarray, margin: float, memory: dict[str, np.ndarray]
) -> np.ndarray:
    """Mask of the reliable, non-redundant rows (``probs``: their softmax, ``entropy``: their prediction
    entropy); the moving average learns from them."""
    keep = entropy < margin
    average = memory.get("probs")
    if average is not None:  # cosine similarity (torch's: each norm at least 1e-8)
        # the norms as np.linalg.norm computes them (bit for bit), without its checks: 10.3 -> 8.9 us at 32 x 10
        norms = np.maximum(np.sqrt((probs * probs).sum(axis=-1)), 1e-8)
        norms *= max(math.sqrt(float(average @ average)), 1e-8)
        keep &= (probs @ average) / norms < REDUNDANT_COSINE
    if keep.any():
        mean = probs[keep].mean(axis=0)
        memory["probs"] = mean if average is None else (1.0 - EMA) * average + EMA * mean
    return keep


def _predictions(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-probabilities, probabilities and entropy of each row, each computed once: the filter and the
    gradient read them all (in a stream a numpy call costs several microseconds, cold after ONNX Runtime's
    pass)."""
    log_p = log_softmax(logits)
    probs = np.exp(log_p)
    return log_p, probs, -(probs * log_p).sum(axis=-1)


def _eata_gradient(
    log_p: np.ndarray, probs: np.ndarray, entropy: np.ndarray, keep: np.ndarray, margin: float
) -> np.ndarray:
    """The gradient of EATA's loss with respect to the logits: the entropy of the kept rows weighted by
    exp(margin - entropy) (the weight held constant), averaged over the batch."""
    weight = np.where(keep, np.exp(margin - entropy), 0.0)[:, None]
    return weighted_entropy_gradient(log_p, weight, probs, entropy[:, None])


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
    tfeeds = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
    differentiable = torch_differentiable(lambda leaves: module({**tfeeds, **leaves})[0])
    params = {name: stats[name] for name in module.parameters}
    source = {name: adapter.source_state[name] for name in params}
    tuned = sar_step(differentiable, params, source, reliable_entropy, learning_rate, steps, memory)
    return {**stats, **{name: v.astype(stats[name].dtype) for name, v in tuned.items()}}


def sar_step(
    differentiable: Differentiable,
    params: dict[str, np.ndarray],
    source: dict[str, np.ndarray],
    reliable_entropy: float,
    learning_rate: float,
    steps: int,
    memory: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """``params`` after ``steps`` reliable, sharpness-aware, anchored steps on the logits ``differentiable``
    computes from them; ``source``: the values the anchor pulls towards."""
    opt = Adam(params, learning_rate)
    for _ in range(steps):
        logits, vjp = differentiable(params)
        margin = reliable_entropy * float(np.log(logits.shape[-1]))
        log_p, probs, entropy = _predictions(logits)
        keep = _reliable(probs, entropy, margin, memory)
        if not keep.any():
            break
        grads = vjp(_eata_gradient(log_p, probs, entropy, keep, margin))
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values())) + 1e-12
        # climb to the sharpest neighbour, take the gradient there, step from where it started
        climbed = {k: p + (SAM_RHO / norm) * grads[k] for k, p in params.items()}
        logits, vjp = differentiable(climbed)
        sharp = vjp(_eata_gradient(*_predictions(logits), keep, margin))
        sharp = {k: g + 2.0 * ANCHOR * (climbed[k] - source[k]) for k, g in sharp.items()}
        params = opt.step(params, sharp)
    return params
