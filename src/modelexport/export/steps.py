"""One graph of a multi-graph package: its example inputs and the step of the model it computes.

A step function stands in for ``forward`` while the graph is captured and checked (:meth:`StepInputs.bind`),
so every graph of a package is captured from the same loaded model and its tags are paths of the same module
tree; no model code is patched. The past, when the graph takes one, is the flat ``past_key_values.*`` tensors
rebuilt into transformers' cache object by ``cache_from`` (our pytree registration flattens it back).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import ExportError
from ..metadata.schema import CACHE_INPUT_PREFIX
from .inputs import ExampleInputs

if TYPE_CHECKING:
    import torch
    from transformers.cache_utils import Cache

__all__ = ["StepFn", "StepInputs"]

#: step(the model's own forward, the model, **graph inputs) -> outputs
StepFn = Callable[..., Any]


@dataclass
class StepInputs(ExampleInputs):
    """Example inputs of one graph of a multi-graph package, and the step that graph computes."""

    file: str = ""
    step: StepFn | None = None
    layers: int = 0
    record: dict[str, Any] = field(default_factory=dict)
    #: The graph's role in the package's manifest (``encoder``, ``vision_encoder``...); default: its file stem.
    role: str = ""
    #: fn(flat past tensors, layers) -> the cache object forward() takes (None: the graph takes no past).
    cache_from: Callable[[list[torch.Tensor], int], Cache] | None = None
    #: Further inputs the graph must match PyTorch on (another image size, an empty past): (label, tensors).
    checks: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def past_names(self) -> list[str]:
        return [n for n in self.names if n.startswith(CACHE_INPUT_PREFIX)]

    def forward_kwargs(self) -> dict[str, Any]:
        """Graph inputs by name; the past as a fresh cache object (a step grows it in place)."""
        past = self.past_names
        kwargs = {n: self.tensors[n] for n in self.names if n not in past}
        if past and self.cache_from is not None:
            kwargs[CACHE_INPUT_PREFIX.rstrip(".")] = self.cache_from(
                [self.tensors[n] for n in past], self.layers
            )
        return kwargs

    def dynamo_shapes(self) -> dict[str, Any]:
        shapes = super().dynamo_shapes()
        past = [shapes[n] for n in self.past_names]
        return {k: past if k == CACHE_INPUT_PREFIX.rstrip(".") else shapes[k] for k in self.forward_kwargs()}

    def with_tensors(self, tensors: dict[str, Any]) -> StepInputs:
        """The same graph's inputs with other values (a check's)."""
        return replace(self, tensors=dict(tensors), checks=())

    @contextlib.contextmanager
    def bind(self, module: torch.nn.Module) -> Iterator[None]:
        """``module.forward`` is this step (signature: the graph's inputs) until the block ends."""
        step = self.step
        if step is None:
            raise ExportError(f"{self.file}: no step to capture")
        original = module.forward
        names = list(self.forward_kwargs())

        def forward(*args: object, **kwargs: object) -> Any:
            return step(original, module, **dict(zip(names, args, strict=False)), **kwargs)

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        forward.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in names])  # type: ignore[attr-defined]
        module.forward = forward
        try:
            yield
        finally:
            del module.forward  # the class's forward is back

    def generation_record(self) -> dict[str, Any]:
        return self.record
