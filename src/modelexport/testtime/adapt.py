"""BatchNorm statistics adaptation inside ONNX Runtime.

The BN initializers (scale, bias, running mean and variance) are exposed as overridable graph inputs and
the BN inputs as extra outputs, so **one shared, read-only session** computes test-batch statistics and
runs with any adapted state passed per call: concurrent callers never see each other's statistics and
the source model is never modified. ``adapted_model(state)`` writes a state into a *copy* of the model.

Each iteration runs the batch with the current state, measures every BN input's per-channel mean and
(biased) variance, and blends them with the prior as a mixture of two distributions with batch weight
``w = momentum * n / (n + prior_strength)`` (``n``: examples in the batch; ``prior_strength``: the prior's
weight in pseudo-examples, "BN adaptation with N source samples", Schneider et al. 2020)::

    mean = (1 - w) * prior_mean + w * batch_mean
    var  = (1 - w) * prior_var + w * batch_var + w * (1 - w) * (batch_mean - prior_mean) ** 2

With ``w = 1`` and one iteration per BN layer the result equals PyTorch's train-mode BatchNorm on the batch.
A class-sorted batch (one class only) or a single example gives statistics far from the population's: a
prior strength or a stream's running statistics (the prior = the previous batches') keep them close to it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from ..errors import TestTimeError
from ..runtime.session import SessionConfig, create_session
from .graph import (
    SAMPLE_STATS,
    ModelLike,
    add_outputs,
    expose_initializers,
    has_upstream,
    initializer_arrays,
    load_model,
    mix_batch_statistics,
    mix_variance_gate,
    mix_weight,
    node_label,
    write_initializers,
)
from .memory import StatisticsPrior

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = ["BNLayer", "BNAdapter", "BNState", "find_bn_layers"]

#: Initializer name -> value: the adapted BN tensors (mean/var, and scale/bias after Tent).
BNState = dict[str, np.ndarray]

NO_BN_HINT = "export with BatchNorm kept: `modelexport export MODEL --keep-batchnorm` (ExportConfig.keep_batchnorm=True)"
#: For a graph without convolutions there was no BatchNorm to keep (a transformer normalizes with LayerNorm).
NO_BN_LAYERS_HINT = (
    "BN adaptation and Tent need BatchNorm layers, which this model does not have (LayerNorm models such as "
    "BERT have none): use test-time augmentation (--tta-transforms) instead"
)


def no_bn_hint(model: onnx.ModelProto) -> str:
    """What to do about a graph without BatchNormalization: keep it at export, if the model had any."""
    convolutions = any(n.op_type in ("Conv", "ConvTranspose") for n in model.graph.node)
    return NO_BN_HINT if convolutions else NO_BN_LAYERS_HINT


@dataclass(frozen=True)
class BNLayer:
    """One BatchNormalization node: its input tensor and its four parameter initializers."""

    node: str
    x: str
    scale: str
    bias: str
    mean: str
    var: str
    epsilon: float

    @property
    def params(self) -> tuple[str, str, str, str]:
        return (self.scale, self.bias, self.mean, self.var)


def find_bn_layers(model: onnx.ModelProto) -> list[BNLayer]:
    """BatchNormalization nodes whose parameters are initializers, in graph order."""
    inits = {t.name for t in model.graph.initializer}
    layers: list[BNLayer] = []
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if node.op_type != "BatchNormalization":
            continue
        x, *params = list(node.input)[:5]
        missing = [p for p in params if p not in inits]
        if missing:
            raise TestTimeError(
                f"BatchNormalization {node.name or i}: parameters {missing} are not initializers; cannot adapt them"
            )
        shared = seen.intersection(params)
        if shared:
            raise TestTimeError(
                f"BatchNormalization {node.name or i} shares parameters {sorted(shared)} with another BN node"
            )
        seen.update(params)
        eps = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
        layers.append(BNLayer(node_label(node, i), x, *params, float(eps)))
    return layers


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (axis 1) mean and biased variance, as BatchNorm's training mode computes them."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    x64 = x.astype(np.float64)
    return x64.mean(axis=axes), x64.var(axis=axes)


class BNAdapter:
    """Adapt BN statistics to a test batch with ONNX Runtime; one shared session, state passed per call.

    The session's graph also reports every example's BN-input statistics (:data:`~.graph.SAMPLE_STATS`) and
    lets each *stem* layer (no BN upstream) mix its given statistics with the batch's own by a weight input
    (:func:`~.graph.mix_weight`, default 0), so the robust statistics of :mod:`.memory` cost one pass. A run
    whose weights are all 0 takes a second session, built on first use, of the graph without the mixing
    nodes: it computes the same, and at batch size 1, where ONNX Runtime's cost is its nodes, a mixing stem
    layer's eighteen were a third of the digits CNN's pass (``benchmarks/test_time.py``).
    """

    def __init__(
        self,
        model: ModelLike,
        providers: list[str] | tuple[str, ...] | None = None,
        session_config: SessionConfig | None = None,
        outputs: list[str] | None = None,
        *,
        report_inputs: bool = True,
    ) -> None:
        """``outputs``: more tensors the session reports on request (a gradient method's tail inputs);
        ``report_inputs``: the BN inputs too, which :meth:`batch_statistics` reads. The memory statistics read
        every example's statistics instead and leave them out: a graph output stays in ONNX Runtime's plain
        layout, and the reorders they kept cost 2-3% of the tests' digits CNN's pass at batch 32 and 3-7% of
        the medium CNN's (``benchmarks/test_time.py``)."""
        self.source = load_model(model)
        self.layers = find_bn_layers(self.source)
        if not self.layers:
            raise TestTimeError(
                "the model has no BatchNormalization nodes: BN adaptation and Tent do not apply",
                hint=no_bn_hint(self.source),
            )
        names = [p for layer in self.layers for p in layer.params]
        self.source_state: BNState = initializer_arrays(self.source, names)
        self.output_names = [o.name for o in self.source.graph.output]
        #: Per layer: a stem layer (no BatchNormalization upstream) mixes in the batch's own statistics.
        self.stem = [not has_upstream(self.source, layer.x, "BatchNormalization") for layer in self.layers]
        self.mixed = [i for i, stem in enumerate(self.stem) if stem]
        self.report_inputs = report_inputs
        self._reported = [layer.x for layer in self.layers if report_inputs] + list(outputs or [])
        working = self._graph(set(self.mixed))
        self.working_model = working
        sizes = [len(self.source_state[layer.mean]) for layer in self.layers]
        #: Each layer's channels in the vectors over all BN channels (``StatisticsPrior``, sample statistics).
        self.channels = [
            slice(a, b) for a, b in zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes), strict=True)
        ]
        self._dtype = self.source_state[self.layers[0].mean].dtype
        self._weight_names = [mix_weight(i) for i in self.mixed]
        self._gate_names = [mix_variance_gate(i) for i in self.mixed]
        self._mix_inputs = {*self._weight_names, *self._gate_names}
        self._feed_slices = [
            (x.mean, x.var, part) for x, part in zip(self.layers, self.channels, strict=True)
        ]
        self._overrides = {"providers": tuple(providers)} if providers else {}
        self._config = session_config
        self.session, self.session_info = create_session(working, session_config, **self._overrides)
        self._unmixed_session: InferenceSession | None = None
        self._lock = threading.Lock()

    def _graph(self, mixed: set[int]) -> onnx.ModelProto:
        """The source with the BN parameters as overridable inputs, the BN inputs (and the requested tensors)
        as outputs, every example's statistics reported, and the ``mixed`` layers mixing in the batch's own."""
        names = [p for layer in self.layers for p in layer.params]
        exposed = add_outputs(expose_initializers(self.source, names), self._reported)
        return mix_batch_statistics(exposed, [layer.node for layer in self.layers], mixed)

    def run(
        self, feeds: dict[str, np.ndarray], state: BNState | None = None, outputs: list[str] | None = None
    ) -> list[np.ndarray]:
        """Run with the given state (missing entries: the source values)."""
        return self.session.run(outputs or self.output_names, {**feeds, **(state or {})})

    def batch_statistics(self, feeds: dict[str, np.ndarray], state: BNState | None = None) -> BNState:
        """Every BN input's batch mean and variance under ``state``."""
        if not self.report_inputs:
            raise TestTimeError("this adapter's graph does not report the BN inputs (report_inputs=False)")
        xs = self.run(feeds, state, [layer.x for layer in self.layers])
        stats: BNState = {}
        for layer, x in zip(self.layers, xs, strict=True):
            stats[layer.mean], stats[layer.var] = channel_stats(x)
        return stats

    def adapt(
        self,
        feeds: dict[str, np.ndarray],
        prior: BNState | None = None,
        momentum: float = 1.0,
        iterations: int | None = None,
        prior_strength: float = 0.0,
    ) -> BNState:
        """A new state from ``prior`` (default: the source) blended with this batch's statistics.

        ``iterations`` None: one pass per BN layer (exact train-mode statistics for weight 1).
        """
        if not 0.0 < momentum <= 1.0:
            raise TestTimeError(f"momentum must be in (0, 1], got {momentum}")
        if prior_strength < 0:
            raise TestTimeError(f"prior_strength must be >= 0, got {prior_strength}")
        n = len(next(iter(feeds.values())))
        w = momentum * n / (n + prior_strength)
        prior = {**self.source_state, **(prior or {})}
        state = dict(prior)
        for _ in range(self.exact_iterations() if iterations is None else max(1, iterations)):
            stats = self.batch_statistics(feeds, state)
            for layer in self.layers:
                p_mean = prior[layer.mean].astype(np.float64)
                p_var = prior[layer.var].astype(np.float64)
                b_mean, b_var = stats[layer.mean], stats[layer.var]
                mean = (1.0 - w) * p_mean + w * b_mean
                var = (1.0 - w) * p_var + w * b_var + w * (1.0 - w) * (b_mean - p_mean) ** 2
                state[layer.mean] = mean.astype(prior[layer.mean].dtype)
                state[layer.var] = var.astype(prior[layer.var].dtype)
        return state

    def prior(self, stem_strength: float, deep_strength: float, gate: float = 0.0) -> StatisticsPrior:
        """The source statistics over every BN channel; stem layers' channels weigh ``stem_strength``
        pseudo-examples, the others ``deep_strength``; the stem layers adapt past a shift of ``gate``."""
        mean = np.concatenate([self.source_state[x.mean] for x in self.layers]).astype(np.float64)
        var = np.concatenate([self.source_state[x.var] for x in self.layers]).astype(np.float64)
        strength, deep = np.empty_like(mean), np.empty(len(mean), bool)
        for part, stem in zip(self.channels, self.stem, strict=True):
            strength[part], deep[part] = (stem_strength if stem else deep_strength), not stem
        gated = [self.channels[i] for i in self.mixed]
        return StatisticsPrior(mean, var, strength, deep, gated, gate)

    def statistics_feeds(
        self,
        mean: np.ndarray | None,
        var: np.ndarray | None,
        batch_weight: float,
        variance_gates: list[float] | None = None,
    ) -> BNState:
        """Feeds for the given statistics over every BN channel (None: the source's), the weight of the
        batch's own statistics in the stem layers and (per stem layer) the share of it their variances take;
        weight 0 feeds neither (the graph's default: :meth:`run_with_statistics` can skip the mixing)."""
        feeds: BNState = {}
        if batch_weight:
            feeds.update(dict.fromkeys(self._weight_names, np.asarray(batch_weight, self._dtype)))
            if variance_gates is not None:
                feeds.update(
                    (k, np.asarray(g, self._dtype))
                    for k, g in zip(self._gate_names, variance_gates, strict=True)
                )
        if mean is not None and var is not None:
            mean, var = mean.astype(self._dtype), var.astype(self._dtype)
            for m, v, part in self._feed_slices:
                feeds[m], feeds[v] = mean[part], var[part]
        return feeds

    def unmixed(self, state: BNState) -> BNState:
        """``state`` with the stem layers' batch weight 0: every layer normalises with the given statistics alone
        (a pass over examples that are not one batch)."""
        return {k: v for k, v in state.items() if k not in self._mix_inputs}

    def mixes(self, state: BNState) -> bool:
        """Whether ``state`` gives a stem layer's batch statistics a weight (the graph's default: none)."""
        return any(name in state and float(state[name]) != 0.0 for name in self._weight_names)

    def _unmixed(self) -> InferenceSession:
        """The session of the graph without the mixing nodes (built once, on first use)."""
        session = self._unmixed_session
        if session is None:
            with self._lock:
                if self._unmixed_session is None:
                    model = self._graph(set())
                    self._unmixed_session = create_session(model, self._config, **self._overrides)[0]
                session = self._unmixed_session
        return session

    def run_with_statistics(
        self, feeds: dict[str, np.ndarray], state: BNState, output: str, extra: list[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(``output``, every example's BN statistics (N, 2S), the ``extra`` outputs) of one run; with no
        batch weight and no ``extra``, in the graph without the mixing nodes."""
        if extra or self.mixes(state):
            out = self.session.run([output, SAMPLE_STATS, *(extra or [])], {**feeds, **state})
        else:
            if any(name in state for name in self._mix_inputs):  # a weight of 0 given: not an input there
                state = self.unmixed(state)
            out = self._unmixed().run([output, SAMPLE_STATS], {**feeds, **state})
        stats = out[1].reshape(len(out[1]), -1)
        return out[0], stats, out[2:]

    def exact_iterations(self) -> int:
        """Iterations after which momentum-1 adaptation equals train-mode BatchNorm (one per BN layer)."""
        return len(self.layers)

    def adapted_model(self, state: BNState) -> onnx.ModelProto:
        """A copy of the source model with the state written into its BN initializers."""
        return write_initializers(self.source, state)
