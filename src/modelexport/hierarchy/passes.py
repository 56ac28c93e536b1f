"""The one shape of a model transform: ``ModelProto -> PassResult`` (the model and what changed).

Graph optimization (``optimize/graph.py``: slimming, fusion, the CPU splits), the quantizer's preparation
steps and re-tagging (``optimize/retag.py``) are passes, so each can be tested alone and chained with
:func:`run_passes`, which records per pass
the node counts, the time and the pass's own ``record``. A pass declares ``in_place``: True when it
edits and returns its input (cheap for large models), False when its input stays untouched. A pass
that needs the model as it was before it (re-tagging) must only follow passes with ``in_place=False``.
Export's tagging and metadata embedding are not passes: they are steps of the package export writes
(``export/api.py``, ``export/package.py``), which need the PyTorch module beside the graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import ModelExportError

if TYPE_CHECKING:
    import onnx

__all__ = ["Pass", "PassResult", "PassStep", "FunctionPass", "run_passes"]


@dataclass(frozen=True)
class PassResult:
    """A pass's output model, whether it differs from the input, and what the pass reports."""

    model: onnx.ModelProto
    changed: bool
    record: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Pass(Protocol):
    """Anything with a ``name``, an ``in_place`` flag and ``__call__(model) -> PassResult``."""

    name: str
    in_place: bool

    def __call__(self, model: onnx.ModelProto) -> PassResult: ...


@dataclass(frozen=True)
class FunctionPass:
    """A function ``model -> PassResult`` as a named pass (for one-off steps that need no class)."""

    name: str
    fn: Callable[[onnx.ModelProto], PassResult]
    in_place: bool = False

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        return self.fn(model)


@dataclass(frozen=True)
class PassStep:
    """What one pass of a chain did: node counts before/after, seconds, and its record."""

    name: str
    changed: bool
    nodes_before: int
    nodes_after: int
    seconds: float
    record: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "changed": self.changed,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "seconds": self.seconds,
            **self.record,
        }


def run_passes(
    model: onnx.ModelProto,
    passes: Iterable[Pass],
    *,
    wrap: Callable[[str], ModelExportError] | None = None,
) -> tuple[onnx.ModelProto, list[PassStep]]:
    """Run ``passes`` in order; returns the last model and one :class:`PassStep` per pass.

    ``wrap(message)`` builds the typed error raised (from the original) when a pass fails with an
    exception that is not already a :class:`ModelExportError`; without it the original propagates.
    """
    steps: list[PassStep] = []
    current = model
    for p in passes:
        start, before = time.perf_counter(), len(current.graph.node)
        try:
            result = p(current)
        except ModelExportError:
            raise
        except Exception as exc:  # noqa: BLE001 - third-party rewriters raise many types; name the pass
            if wrap is None:
                raise
            raise wrap(f"pass {p.name!r} failed: {type(exc).__name__}: {exc}") from exc
        elapsed = round(time.perf_counter() - start, 3)
        steps.append(
            PassStep(p.name, result.changed, before, len(result.model.graph.node), elapsed, result.record)
        )
        current = result.model
    return current, steps
