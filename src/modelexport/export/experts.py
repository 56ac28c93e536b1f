"""Mixture-of-experts layers: capture every expert, so the graph does not depend on the example's routing.

A sparse expert block (an ``experts`` ``nn.ModuleList`` whose forward loops over the experts the
router hit, found with ``nonzero()`` on a per-expert boolean) cannot be captured as is: torch.export
cannot iterate over a tensor of data-dependent length, and the TorchScript tracer would bake the
example's hit list into the graph. During capture, that one ``nonzero()`` answers "every expert":
each expert then gathers its routed tokens with its own data-dependent ``where``, an expert that no
token chose gathers none and adds nothing, so the outputs are unchanged for every input, not only
the example. The tagged export and the plain baseline are captured under the same rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["EXPERT_ROUTE", "expert_blocks", "every_expert_runs"]

EXPERT_ROUTE = (
    "mixture-of-experts: every expert captured on the tokens routed to it "
    "(the expert loop runs over all experts instead of the example's hit list; outputs are unchanged)"
)


def expert_blocks(model: Any) -> list[Any]:
    """Modules holding their experts in an ``experts`` ``nn.ModuleList``."""
    import torch.nn as nn

    return [m for m in model.modules() if isinstance(getattr(m, "experts", None), nn.ModuleList)]


@contextlib.contextmanager
def every_expert_runs(model: Any) -> Iterator[int]:
    """While active, ``nonzero()`` of a 1-D boolean with one entry per expert, called inside an expert
    block, returns every expert index; yields the number of expert blocks (0: nothing changes)."""
    import torch
    from torch.overrides import TorchFunctionMode

    blocks = expert_blocks(model)
    if not blocks:
        yield 0
        return
    active: list[int] = []
    # Python-side index tensors: iterating them and indexing the ModuleList stays static under tracing.
    every = {n: [torch.tensor([i]) for i in range(n)] for n in {len(b.experts) for b in blocks}}

    class _EveryExpert(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if active and func in (torch.Tensor.nonzero, torch.nonzero) and not kwargs:
                t = args[0]
                if t.dim() == 1 and t.dtype == torch.bool and t.shape[0] == active[-1]:
                    return every[active[-1]]
            return func(*args, **kwargs)

    def enter(module: Any, _args: Any) -> None:
        active.append(len(module.experts))

    def leave(_module: Any, _args: Any, _out: Any) -> None:
        active.pop()

    handles = [
        h for b in blocks for h in (b.register_forward_pre_hook(enter), b.register_forward_hook(leave))
    ]
    try:
        with _EveryExpert():
            yield len(blocks)
    finally:
        for h in handles:
            h.remove()
