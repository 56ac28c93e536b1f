"""Mixture-of-experts layers: capture every expert, so the graph does not depend on the example's routing.

A sparse expert block (an ``experts`` ``nn.ModuleList`` on transformers 4, or on transformers 5 an experts
module with ``num_experts`` stacked weights, run with transformers' ``"eager"`` experts implementation) loops
over the experts the router hit, found with ``nonzero()`` on a per-expert boolean (transformers 5 adds one
sentinel entry). That loop cannot be captured as is: torch.export
cannot iterate over a tensor of data-dependent length, and the TorchScript tracer would bake the
example's hit list into the graph. During capture, that one ``nonzero()`` answers "every expert":
each expert then gathers its routed tokens with its own data-dependent ``where``, an expert that no
token chose gathers none and adds nothing, so the outputs are unchanged for every input, not only
the example. The tagged export and the plain baseline are captured under the same rule.

transformers 5's default experts kernels (``grouped_mm``, ``batched_mm``) are not ONNX-exportable, or gather
one weight matrix per token: during capture the model runs its ``"eager"`` implementation (transformers' own
``set_experts_implementation``), the same arithmetic, restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["EXPERT_ROUTE", "EAGER_EXPERTS", "eager_experts", "expert_blocks", "every_expert_runs"]

#: transformers' experts implementation whose loop over experts can be captured.
EAGER_EXPERTS = "eager"

EXPERT_ROUTE = (
    "mixture-of-experts: every expert captured on the tokens routed to it "
    "(the expert loop runs over all experts instead of the example's hit list; outputs are unchanged)"
)


def _expert_count(module: torch.nn.Module) -> int:
    """How many experts ``module`` loops over (0: it is not an expert block)."""
    import torch.nn as nn

    experts = getattr(module, "experts", None)
    if isinstance(experts, nn.ModuleList):  # transformers 4: one module per expert
        return len(experts)
    config = getattr(module, "config", None)
    count = getattr(module, "num_experts", None)
    if isinstance(count, int) and hasattr(config, "_experts_implementation"):  # transformers 5: stacked
        return count
    return 0


def expert_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that loop over their experts: an ``experts`` ``nn.ModuleList``, or transformers 5's experts
    modules (``num_experts`` stacked weights dispatched by ``config._experts_implementation``)."""
    return [m for m in model.modules() if _expert_count(m)]


@contextlib.contextmanager
def eager_experts(model: torch.nn.Module) -> Iterator[None]:
    """transformers 5: the model's experts run their ``"eager"`` loop while the block runs (the export's
    reference run, capture and parity check all use it; the user's model gets its own setting back)."""
    config = getattr(model, "config", None)
    previous = getattr(config, "_experts_implementation", None)
    switch = callable(getattr(model, "set_experts_implementation", None)) and previous not in (
        None,
        EAGER_EXPERTS,
    )
    if switch:
        model.set_experts_implementation(EAGER_EXPERTS)
    try:
        yield
    finally:
        if switch:
            model.set_experts_implementation(previous)


@contextlib.contextmanager
def every_expert_runs(model: torch.nn.Module) -> Iterator[int]:
    """While active, ``nonzero()`` of a 1-D boolean with one entry per expert, called inside an expert
    block, returns every expert index; yields the number of expert blocks (0: nothing changes)."""
    import torch
    from torch.overrides import TorchFunctionMode

    blocks = expert_blocks(model)
    if not blocks:
        yield 0
        return
    active: list[Any] = []  # the block being run: its expert count and the hit list it gets

    def hit_list(module: torch.nn.Module) -> tuple[int, list[Any]]:
        """Python-side indices, so that iterating them and indexing the experts stays static under tracing:
        1-element tensors for a ``ModuleList`` (``experts[idx]``, ``mask[idx].squeeze(0)``), ``[i]`` for
        stacked weights, whose loop reads ``idx[0]`` and compares it with the sentinel in Python."""
        n = _expert_count(module)
        if isinstance(getattr(module, "experts", None), torch.nn.ModuleList):
            return n, [torch.tensor([i]) for i in range(n)]
        return n, [[i] for i in range(n)]

    class _EveryExpert(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Callable[..., Any],
            types: Collection[type],
            args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            kwargs = kwargs or {}
            if active and func in (torch.Tensor.nonzero, torch.nonzero) and not kwargs:
                t, (n, every) = args[0], active[-1]
                # one entry per expert, plus transformers 5's sentinel ("no expert") entry
                if t.dim() == 1 and t.dtype == torch.bool and t.shape[0] in (n, n + 1):
                    return every
            return func(*args, **kwargs)

    def enter(module: torch.nn.Module, _args: tuple[object, ...]) -> None:
        active.append(hit_list(module))

    def leave(_module: torch.nn.Module, _args: tuple[object, ...], _out: object) -> None:
        active.pop()

    handles = [
        h for b in blocks for h in (b.register_forward_pre_hook(enter), b.register_forward_hook(leave))
    ]
    try:
        with eager_experts(model), _EveryExpert():
            yield len(blocks)
    finally:
        for h in handles:
            h.remove()
