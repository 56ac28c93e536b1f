"""The adaptation-method registry: ``policy.ttt`` names one; the engine calls its ``step`` or ``adapt``.

With the memory statistics (the default) the engine measures the BN statistics itself (``memory.py``, one ONNX
Runtime pass); a gradient method's ``step`` then updates the scale/bias of the last BN layers through the
graph's tail, on the tail inputs that pass computed (``tail.py``; BN has no step). With batch statistics every method's ``adapt`` maps (batch, policy, stream)
to a BN state. Episodic policies get a fresh :class:`Stream` per batch (start from the source); continual ones
the caller's stream, whose state is the prior and whose ``memory`` (the redundancy filter's moving average)
persists until a reset.

BN statistics are blended with the prior with batch weight ``w = n / (n + strength)`` (``adapt.py``).
Episodic: ``strength = bn_prior`` (and ``w`` scaled by ``momentum``). Continual: the running statistics are
the average over the stream so far, the source counting as ``bn_prior`` examples (``strength = bn_prior +
seen``), with ``momentum`` as the floor of ``w`` so they keep tracking a shift -- a bias-corrected running
average: the first batches move the statistics quickly, later ones by ``momentum``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .._registry import Registry
from ..errors import TestTimeError
from .sar import sar_adapt, sar_step
from .streams import MIN_BATCH, Stream
from .tent import tent_adapt, tent_step

if TYPE_CHECKING:
    import torch

    from .adapt import BNAdapter, BNState
    from .tail import Tail

__all__ = ["ADAPTATION_METHODS", "AdaptationMethod", "AdaptationSettings", "statistics"]


class AdaptationSettings(Protocol):
    """What a method reads of the test-time policy. ``TestTimePolicy`` has these fields; the policy module
    imports this registry (to check ``--ttt`` names), so the registry names the fields, not the policy."""

    ttt_iterations: int | None
    momentum: float
    bn_prior: float
    learning_rate: float
    episodic: bool
    reliable_entropy: float


AdaptFn = Callable[
    ["BNAdapter", dict[str, np.ndarray], AdaptationSettings, "torch.nn.Module | None", Stream], "BNState"
]
#: (the graph's tail, its inputs from the predicting passes, policy, the statistics its BN layers normalise
#: with, their current scale/bias, stream) -> the updated scale/bias (``tail.py``).
StepFn = Callable[
    ["Tail", dict[str, np.ndarray], AdaptationSettings, "BNState", "BNState", Stream], dict[str, np.ndarray]
]


@dataclass(frozen=True)
class AdaptationMethod:
    """A named method: a one-line description, ``adapt(adapter, feeds, policy, torch_model, stream)`` for
    batch statistics (None for ``none``) and ``step`` for the memory statistics (None: statistics only)."""

    description: str
    adapt: AdaptFn | None = None
    step: StepFn | None = None
    #: Fewest examples a batch needs for ``step`` (smaller batches: the statistics alone).
    min_batch: int = 1

    def __str__(self) -> str:
        return self.description


#: Test-time training methods by name (``--ttt``).
ADAPTATION_METHODS: Registry[AdaptationMethod] = Registry(
    "test-time adaptation method",
    error=TestTimeError,
    hint="choose the test-time adaptation method from the list",
)
ADAPTATION_METHODS.add("none", AdaptationMethod("no adaptation: the exported model as is"))


def statistics(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    policy: AdaptationSettings,
    stream: Stream,
    prior: BNState | None = None,
    iterations: int | None = None,
) -> BNState:
    """The policy's robust BN statistics for this batch (``prior``: default the stream's state)."""
    prior = stream.state if prior is None else prior
    if policy.episodic:
        return adapter.adapt(feeds, prior, policy.momentum, iterations, policy.bn_prior)
    n = len(next(iter(feeds.values())))
    strength = policy.bn_prior + stream.seen
    if policy.momentum < 1.0:
        strength = min(strength, n * (1.0 - policy.momentum) / policy.momentum)
    else:
        strength = 0.0
    return adapter.adapt(feeds, prior, 1.0, iterations, strength)


def _bn(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    policy: AdaptationSettings,
    torch_model: torch.nn.Module | None,
    stream: Stream,
) -> BNState:
    return statistics(adapter, feeds, policy, stream, iterations=policy.ttt_iterations)


def _tent(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    policy: AdaptationSettings,
    torch_model: torch.nn.Module | None,
    stream: Stream,
) -> BNState:
    return tent_adapt(adapter, feeds, stream.state, policy.learning_rate, policy.ttt_iterations, torch_model)


def _sar(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    policy: AdaptationSettings,
    torch_model: torch.nn.Module | None,
    stream: Stream,
) -> BNState:
    """Robust statistics, a reliable SAM step on the affine parameters, statistics again under them."""
    tuned = sar_adapt(
        adapter,
        feeds,
        statistics(adapter, feeds, policy, stream),
        reliable_entropy=policy.reliable_entropy,
        learning_rate=policy.learning_rate,
        steps=policy.ttt_iterations or 1,
        memory=stream.memory,
    )
    affine = {n: tuned[n] for layer in adapter.layers for n in (layer.scale, layer.bias)}
    return {**statistics(adapter, feeds, policy, stream, {**(stream.state or {}), **affine}), **affine}


def _tent_step(
    tail: Tail,
    inputs: dict[str, np.ndarray],
    policy: AdaptationSettings,
    values: BNState,
    params: BNState,
    stream: Stream,
) -> BNState:
    steps = policy.ttt_iterations or 1
    return tent_step(tail.differentiable(inputs, values), params, policy.learning_rate, steps)


def _sar_step(
    tail: Tail,
    inputs: dict[str, np.ndarray],
    policy: AdaptationSettings,
    values: BNState,
    params: BNState,
    stream: Stream,
) -> BNState:
    return sar_step(
        tail.differentiable(inputs, values),
        params,
        tail.source,
        policy.reliable_entropy,
        policy.learning_rate,
        policy.ttt_iterations or 1,
        stream.memory,
    )


ADAPTATION_METHODS.add(
    "bn",
    AdaptationMethod(
        "BatchNorm statistics, computed with ONNX Runtime: robust ones from the stream's class-balanced memory "
        "(default), or each batch's own (--statistics batch)",
        _bn,
    ),
)
ADAPTATION_METHODS.add(
    "tent",
    AdaptationMethod(
        "entropy minimisation of the BN affine parameters (Tent) under the BN statistics: with the memory "
        "statistics, of the last BN layers through the graph's tail, once per 512 examples of batches of 16 or "
        "more (one example's entropy is minimised by any confident class)",
        _tent,
        _tent_step,
        min_batch=MIN_BATCH,
    ),
)
ADAPTATION_METHODS.add(
    "sar",
    AdaptationMethod(
        "reliable entropy minimisation (EATA/SAR-style): robust BN statistics, reliable non-redundant examples, "
        "sharpness-aware step anchored to the source, as tent's (batches of 16 or more: stepping on single "
        "examples drifted 17 points below plain on noisy digits)",
        _sar,
        _sar_step,
        min_batch=MIN_BATCH,
    ),
)
