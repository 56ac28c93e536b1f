"""The gradient methods' step, kept to the end of the graph and taken once per ``STEP_EXAMPLES``.

Tent and sar update BN scale/bias by a gradient step; ONNX Runtime has no gradients. Through the whole graph in
torch (:class:`~.interpreter.OnnxTorchModule`) a step costs a torch forward and backward per batch, 5-25x a
plain ONNX Runtime pass at batch 32 (``benchmarks/test_time.py``). Here:

- **the tail only**: the step trains the last ``step_layers`` BN layers' scale/bias (default
  ``TAIL_LAYERS``), and only the graph from the first of them to the output runs (:func:`~.graph.tail_model`),
  fed with the tensors the ONNX Runtime pass that predicted the batch already computed -- that pass fetches
  them as extra outputs;
- **in numpy where it can**: a tail of operators with numpy rules (``backprop.py``: BN, activations, pooling,
  reshapes, Gemm -- the default one-layer tail of the test and pipeline CNNs) runs forward and back in numpy,
  any other in torch. In a stream, where ONNX Runtime's passes leave torch's dispatch cold, a tail step through
  torch cost 1.1-1.9 ms on the tests' digits CNN (tent, sar), in numpy about 0.45 ms: at batch 32 tent went
  from 2.3-2.4x plain to 2.1x, sar from 2.5-2.6x to 2.1-2.2x, predictions the same (384 accuracy cells of
  four networks, tent and sar, batch 40 and 1);
- **built once**: the tail is built with the engine and shared (read-only) by every caller; the parameters,
  statistics and inputs of a step are passed in, never stored in it;
- **predict, then update**: the batch is served by that one ONNX Runtime pass and the step applies from the
  next batch on, as Tent's and SAR's reference implementations return the outputs of the forward pass they
  step from; no second pass;
- **one step per ``STEP_EXAMPLES``**: a stream keeps every ``STEP_STRIDE``-th example of its batches (of
  ``MIN_BATCH`` or more: one example's entropy is minimised by any confident class) and steps on those 32
  once ``STEP_EXAMPLES`` have passed -- spread over time, so a class-sorted stream's step sees several
  classes; a step costs several plain batches of these small networks. The price: streams shorter than 512
  examples take no step (tent and sar are bn there), and the step is a small part of the adaptation
  (measured: within 0.1 point of bn over four passes of the test sets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..errors import TestTimeError
from .backprop import Differentiable, NumpyTail, torch_differentiable
from .graph import mixed_statistics, node_label, tail_model
from .interpreter import OnnxTorchModule

if TYPE_CHECKING:
    from .adapt import BNAdapter, BNLayer, BNState

__all__ = ["STEP_EXAMPLES", "STEP_STRIDE", "TAIL_LAYERS", "Tail", "TailBuffer", "tail_outputs"]

#: BN layers (the last ones) whose scale/bias a gradient step trains.
TAIL_LAYERS = 1
#: Examples (of batches of at least ``streams.MIN_BATCH``) a stream sees per gradient step.
STEP_EXAMPLES = 512
#: Every this many-th of them is stepped on (32 per step).
STEP_STRIDE = 16


def _plan(
    model: onnx.ModelProto, layers: list[BNLayer], count: int, output: str
) -> tuple[onnx.ModelProto, list[str]]:
    """The tail from the first of the last ``count`` BN layers (0: all) and the tensors it is fed."""
    trained = layers[-count:] if count else layers
    labels = {node_label(n, i): i for i, n in enumerate(model.graph.node)}
    return tail_model(model, min(labels[layer.node] for layer in trained), output)


def tail_outputs(model: onnx.ModelProto, layers: list[BNLayer], count: int, output: str) -> list[str]:
    """The tensors a pass must report for a tail of the last ``count`` BN layers (those it is fed that are
    not graph inputs): the adapter exposes them as outputs."""
    inputs = {i.name for i in model.graph.input}
    return [name for name in _plan(model, layers, count, output)[1] if name not in inputs]


@dataclass(frozen=True)
class Tail:
    """The graph from the trained BN layers to the output (in numpy, or as a torch module), and what it is fed."""

    #: The tail in torch, where an operator has no numpy rule (None: it runs in ``numpy``).
    module: OnnxTorchModule | None
    #: The tail in numpy (``backprop.py``; None: an operator has no rule there).
    numpy: NumpyTail | None
    #: Tensors of the full graph the tail reads: graph inputs (from the feeds) and tensors the predicting
    #: pass reports (``reported``).
    inputs: tuple[str, ...]
    reported: tuple[str, ...]
    #: The trained BN layers.
    layers: tuple[BNLayer, ...]
    #: The trained layers that mix the batch's own statistics (stem layers: their index in ``adapter.mixed``).
    mixed: tuple[tuple[BNLayer, int], ...]
    #: The trained parameters' source values (what sar's anchor pulls towards).
    source: dict[str, np.ndarray]

    @classmethod
    def build(cls, adapter: BNAdapter, output: str, layers: int = TAIL_LAYERS) -> Tail:
        """``layers``: the last this many BN layers are trained (0 or more than there are: all)."""
        trained = tuple(adapter.layers[-layers:] if layers else adapter.layers)
        model, fed = _plan(adapter.source, adapter.layers, layers, output)
        if not fed:
            raise TestTimeError(f"the output {output!r} does not depend on the BatchNormalization layers")
        graph_inputs = {i.name for i in adapter.source.graph.input}
        mixed = tuple(
            (adapter.layers[i], k) for k, i in enumerate(adapter.mixed) if adapter.layers[i] in trained
        )
        names = [name for layer in trained for name in (layer.scale, layer.bias)]
        source = {name: adapter.source_state[name] for name in names}
        reported = tuple(name for name in fed if name not in graph_inputs)
        statistics = [name for layer in trained for name in (layer.mean, layer.var)]
        numpy = NumpyTail.build(model, names, statistics)
        module = OnnxTorchModule(model, train_bn=False) if numpy is None else None
        return cls(module, numpy, tuple(fed), reported, trained, mixed, source)

    @property
    def fetch(self) -> list[str]:
        """Outputs the predicting pass adds for a step: the reported tail inputs, then the statistics the
        mixed layers normalised with."""
        return [*self.reported, *(name for _, k in self.mixed for name in mixed_statistics(k))]

    def gather(self, feeds: dict[str, np.ndarray], fetched: list[np.ndarray]) -> list[np.ndarray]:
        """The tail's inputs in order, from the feeds and the outputs ``fetch`` named."""
        reported = dict(zip(self.reported, fetched, strict=False))
        return [reported[name] if name in reported else feeds[name] for name in self.inputs]

    def parameters(self, state: BNState) -> dict[str, np.ndarray]:
        """The trained scale/bias values in ``state`` (the source's where it has none)."""
        return {name: state[name] for layer in self.layers for name in (layer.scale, layer.bias)}

    def statistics(self, state: BNState, fetched: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The mean/var each trained layer normalised with in the pass that fetched ``fetched``."""
        out = {name: state[name] for layer in self.layers for name in (layer.mean, layer.var)}
        mixed = fetched[len(self.reported) :]
        for j, (layer, _) in enumerate(self.mixed):
            out[layer.mean], out[layer.var] = mixed[2 * j], mixed[2 * j + 1]
        return out

    def differentiable(self, inputs: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> Differentiable:
        """The logits the tail computes from the fed ``inputs`` under the statistics ``values``, as a function
        of the trained scale/bias (in numpy where every operator has a rule, else in torch)."""
        tail, module = self.numpy, self.module
        if tail is not None:
            fed = {**inputs, **values}
            return lambda params: tail({**fed, **params})
        import torch

        assert module is not None  # built where the numpy tail is not
        fed_torch = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in {**inputs, **values}.items()}
        return torch_differentiable(lambda leaves: module({**fed_torch, **leaves})[0])


@dataclass
class TailBuffer:
    """The tail inputs of the examples a stream's next step learns from: every ``STEP_STRIDE``-th example of
    its batches (of ``MIN_BATCH`` or more), spread over the ``STEP_EXAMPLES`` since the last step."""

    rows: list[list[np.ndarray]] = field(default_factory=list)
    #: Examples seen since the last step.
    examples: int = 0
    #: Every input had the batch as its leading axis so far (a tail fed a tensor without it -- shape
    #: arithmetic it could not recompute -- steps on the newest batch instead).
    stackable: bool = True

    def add(self, fetched: list[np.ndarray], n: int) -> None:
        """One batch's tail inputs (``n`` examples)."""
        if self.stackable and all(np.ndim(a) >= 1 and len(a) == n for a in fetched):
            first = (-self.examples) % STEP_STRIDE
            if first < n:  # a copy of the picked rows: a view would hold the whole batch's tensors
                self.rows.append([a[first::STEP_STRIDE].copy() for a in fetched])
        else:
            self.stackable, self.rows = False, [fetched]
        self.examples += n

    @property
    def due(self) -> bool:
        return self.examples >= STEP_EXAMPLES

    def take(self, tail: Tail) -> dict[str, np.ndarray]:
        """The gathered tail inputs by name, concatenated along the batch; the buffer is emptied."""
        if len(self.rows) == 1:
            out = dict(zip(tail.inputs, self.rows[0], strict=True))
        else:
            out = {name: np.concatenate([r[i] for r in self.rows]) for i, name in enumerate(tail.inputs)}
        self.rows, self.examples, self.stackable = [], 0, True
        return out
