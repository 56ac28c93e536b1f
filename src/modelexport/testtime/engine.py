"""``TestTimeEngine``: one entry point that spends test-time compute on an ONNX model.

``TestTimeEngine(model, policy, providers).predict(feeds, stream) -> probabilities (N, C)``. Per call, in
order: denoise or sharpen image inputs where the model records its source's noise and detail
(``denoise.py``), adapt BN statistics or run Tent on the batch (``policy.ttt``), run the TTA views (batched
when the batch axis is dynamic) with MC-dropout passes inside each view, and aggregate. Sessions are built once and
never modified: an adaptation lives in a :class:`Stream` the caller holds (``engine.new_stream()``; one per
client, the engine keeps none), so concurrent callers are isolated. A call without a stream starts from the
source and keeps nothing.

The default (``statistics="memory"``) costs one ONNX Runtime pass (two on a stream's first batch where its
statistics show a shift): the pass that predicts also reports every example's BN statistics into the stream's
class-balanced memory (``memory.py``), and its stem BN layers mix in the batch's own statistics (on a stream
whose classes arrive in runs, only as far as the stem sees a shift: a batch there is one class). The collapse
guard runs the source model only while the adapted predictions look collapsed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import onnx

from .._numeric import softmax
from ..errors import InferenceError, TestTimeError
from ..metadata import read_metadata
from ..metadata.schema import KEY_INPUT_NOISE, KEY_SOURCE_ANCHORS
from ..runtime.session import SessionConfig, SessionInfo, create_session
from .adapt import BNAdapter, BNState, find_bn_layers
from .aggregate import aggregate
from .anchors import (
    FIRST_MEANS,
    LONGEST,
    MIN_EXAMPLES,
    NOISE_OPEN,
    PER_CLASS,
    WINDOW,
    AnchorComparison,
    ShiftWindow,
    SourceAnchors,
    classes_share,
    means_fade,
)
from .augment import make_views
from .denoise import InputNoise, calibrate, measurable, noisy_levels, restore_measured
from .graph import ModelLike, load_model, mixed_statistics
from .mcdropout import MCDropoutResult, enable_mc_dropout, mc_summary
from .memory import BLUR_GATE, StatisticsMemory, StatisticsPrior, opening
from .methods import ADAPTATION_METHODS, AdaptationMethod
from .policy import POLICY_PRESETS, TestTimePolicy
from .streams import (
    MIN_BATCH,
    PRIOR_WINDOW,
    CollapseGuard,
    LabelHistory,
    Stream,
    StreamOrder,
    prior_correction,
)
from .tail import Tail, TailBuffer, tail_outputs

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch

__all__ = [
    "CALIBRATION_BATCH",
    "MIN_STEM_WEIGHT",
    "REFRESH_EXAMPLES",
    "TestTimeEngine",
    "TestTimeResult",
    "Stream",
    "calibrate_anchors",
    "calibrate_restoration",
]

#: Each example's excess noise and detail deficit as given (``denoise.restore_measured``; None: not read).
Readings = tuple[np.ndarray | None, np.ndarray | None]

#: Examples a stream's memory takes before its blended statistics are recomputed (every batch of 8 or more).
REFRESH_EXAMPLES = 8
#: The batch size of :func:`calibrate_anchors`' class-ordered streams.
CALIBRATION_BATCH = 32
#: The least weight a batch's own statistics take in the stem (``_memory_state``); a batch that would weigh less
#: -- one example once the memory holds 48 (beside a full memory 1/145), two beside a full memory -- weighs
#: nothing, and its pass runs the graph without the mixing nodes (``BNAdapter``), a third of the digits CNN's
#: pass at batch size 1. At 1/16 (every single example) the final grid's noisy streams at batch 1 lost 0.1 point
#: on average on the noise + contrast combination, up to 1.5 on one stream; at 1/64, 0.00-0.02 (each within 0.7).
MIN_STEM_WEIGHT = 1 / 64


@dataclass
class TestTimeResult:
    """Probabilities plus what was spent: views, rows augmented (adaptive TTA), MC-dropout uncertainty."""

    __test__ = False

    probs: np.ndarray
    n_views: int = 1
    n_augmented: int = 0
    adapted: bool = False
    uncertainty: MCDropoutResult | None = None
    batched: bool = True
    #: The collapse guard reset the stream on this batch (the batch was then predicted by the source model).
    reset: bool = False
    #: Why the guard served this batch with the source model: "collapse", "label shift", "small batch".
    fallback: str | None = None


class TestTimeEngine:
    """Predict with a :class:`TestTimePolicy` on an exported folder, ``.onnx`` path, bytes or ModelProto."""

    __test__ = False

    def __init__(
        self,
        model: ModelLike,
        policy: TestTimePolicy | None = None,
        providers: list[str] | tuple[str, ...] | None = None,
        *,
        torch_model: torch.nn.Module | None = None,
        input_name: str | None = None,
        output_name: str | None = None,
        session_config: SessionConfig | None = None,
        session: ort.InferenceSession | None = None,
        session_info: SessionInfo | None = None,
    ) -> None:
        """``session``: an existing session of the unmodified model (a pipeline's), reused when the policy
        needs no rewritten graph; otherwise one session of the rewritten graph is built with
        ``session_config`` (the caller's providers, threads and optimization level are kept)."""
        self.policy = policy or TestTimePolicy()
        self.torch_model = torch_model
        #: The policy's adaptation method (looked up once: the per-batch path is Python-bound on small models).
        self._method = ADAPTATION_METHODS.get(self.policy.ttt)
        source = load_model(model)
        working = enable_mc_dropout(source, self.policy.seed) if self.policy.mc_dropout else source
        self.adapter: BNAdapter | None = None
        if self.policy.ttt != "none":
            self.adapter = BNAdapter(
                working,
                providers,
                session_config,
                self._tail_outputs(working, output_name),
                report_inputs=self.policy.statistics != "memory",
            )
            self.session, self.session_info = self.adapter.session, self.adapter.session_info
        elif session is not None and working is source:
            self.session, self.session_info = session, session_info
        else:
            self.session, self.session_info = create_session(
                working, session_config, **({"providers": tuple(providers)} if providers else {})
            )
        inits = {t.name for t in source.graph.initializer}
        self.inputs = [i for i in source.graph.input if i.name not in inits]
        self._input_names = [i.name for i in self.inputs]
        self.input_name = input_name or self.inputs[0].name
        self.output_name = output_name or source.graph.output[0].name
        self.dynamic_batch = self._batch_is_dynamic(self.input_name)
        self.modality = self._modality()
        self._noise = self._input_noise(source)
        self._prior: StatisticsPrior | None = None
        self._tail: Tail | None = None
        if self.adapter is not None and self.policy.statistics == "memory":
            self._prior = self.adapter.prior(
                self.policy.stem_prior, self.policy.deep_prior, self.policy.shift_gate
            )
            if self._method.step is not None:  # built once, shared by every stream
                self._tail = Tail.build(self.adapter, self.output_name, self.policy.step_layers)
        self._anchors = self._source_anchors(source)
        #: How far a first batch moves its measured deep means (``FIRST_MEANS``; 0 in :func:`calibrate_anchors`).
        self._first_means = FIRST_MEANS
        #: The deeper BN layers' channels (no stem), where the anchors measure a shift.
        self._deep = (
            [part for part, stem in zip(self.adapter.channels, self.adapter.stem, strict=True) if not stem]
            if self.adapter is not None
            else []
        )

    # ----------------------------------------------------------------------------------------- introspection

    def _tail_outputs(self, model: onnx.ModelProto, output_name: str | None) -> list[str]:
        """The tensors a gradient method's tail is fed (the memory statistics' tent and sar; ``tail.py``)."""
        p = self.policy
        if p.statistics != "memory" or ADAPTATION_METHODS.get(p.ttt).step is None:
            return []
        layers = find_bn_layers(model)
        if not layers:
            return []  # the adapter says what is missing
        return tail_outputs(model, layers, p.step_layers, output_name or model.graph.output[0].name)

    def _batch_is_dynamic(self, name: str) -> bool:
        vi = next(i for i in self.inputs if i.name == name)
        dims = vi.type.tensor_type.shape.dim
        return not dims or not dims[0].HasField("dim_value")

    def _modality(self) -> str:
        if self.policy.modality != "auto":
            return self.policy.modality
        vi = next(i for i in self.inputs if i.name == self.input_name)
        rank = len(vi.type.tensor_type.shape.dim)
        if vi.type.tensor_type.elem_type in (6, 7):  # int32/int64: token ids, augment text before tokenizing
            return "text"
        return "image" if rank == 4 else "tensor"

    def _input_noise(self, model: onnx.ModelProto) -> InputNoise | None:
        """The source's record where this engine restores inputs: an adapting method on image inputs of a
        model that carries it (``denoise.py``), with the policy's strengths where it sets them, one above 0."""
        p = self.policy
        if self.adapter is None or p.denoise == p.sharpen == 0 or self.modality != "image":
            return None
        record = read_metadata(model).get(KEY_INPUT_NOISE)
        if not isinstance(record, dict):
            return None
        noise = InputNoise.from_dict(record)
        noise = replace(
            noise,
            strength=noise.strength if p.denoise is None else p.denoise,
            sharpen=noise.sharpen if p.sharpen is None else p.sharpen,
        )
        return noise if noise.strength or noise.sharpen else None

    def _source_anchors(self, model: onnx.ModelProto) -> SourceAnchors | None:
        """The model's recorded anchors (``modelexport.source_anchors``) where this engine takes them, in its
        input's type; ``PER_CLASS`` of each class at most (an older record kept more)."""
        if not self._takes_anchors():
            return None
        record = read_metadata(model).get(KEY_SOURCE_ANCHORS)
        if not isinstance(record, dict):
            return None
        return self._as_input(SourceAnchors.from_dict(record).first(PER_CLASS))

    def _as_input(self, anchors: SourceAnchors) -> SourceAnchors:
        """``anchors`` in the type of this engine's input: a measurement may run them alone."""
        vi = next(i for i in self.inputs if i.name == self.input_name)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        return replace(anchors, x=anchors.x.astype(dtype, copy=False))

    def _takes_anchors(self) -> bool:
        """Whether this engine measures a noisy stream's deep variances against source anchors (``anchors.py``):
        the memory statistics on a one-input model with deeper BN layers and a dynamic batch that restores its
        inputs, unless the policy turns them off."""
        adapter = self.adapter
        if adapter is None or self._prior is None or self._noise is None or not self.policy.anchors:
            return False
        return len(self.inputs) == 1 and self.dynamic_batch and not all(adapter.stem)

    def new_stream(self) -> Stream:
        """A fresh adaptation stream: one per client of a continual policy (the default), passed to every call."""
        return Stream()

    # ----------------------------------------------------------------------------------------------- running

    def _run(self, feeds: dict[str, np.ndarray], state: BNState | None) -> np.ndarray:
        try:
            if self.adapter is not None:
                return self.adapter.run(feeds, state, [self.output_name])[0]
            return self.session.run([self.output_name], feeds)[0]
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors are re-raised with the input names
            names = ", ".join(f"{i.name}" for i in self.inputs)
            raise InferenceError(
                f"running the model failed ({type(exc).__name__}: {exc}); model inputs: {names}"
            ) from exc

    def _forward(
        self, feeds: dict[str, np.ndarray], state: BNState | None
    ) -> tuple[np.ndarray, MCDropoutResult | None]:
        """Logits of one view (B, C); with MC dropout the log of the pass-averaged probabilities."""
        passes = self.policy.mc_dropout
        if not passes:
            return self._run(feeds, state), None
        n = len(next(iter(feeds.values())))
        if self.dynamic_batch and self.policy.batched:
            tiled = {k: np.concatenate([v] * passes) if _batched(v, n) else v for k, v in feeds.items()}
            out = self._run(tiled, state)
            logits = out.reshape(passes, n, *out.shape[1:])
        else:
            logits = np.stack([self._run(feeds, state) for _ in range(passes)])
        summary = mc_summary(logits)
        return np.log(np.clip(summary.probs, 1e-12, 1.0)), summary

    def _adapt(self, feeds: dict[str, np.ndarray], stream: Stream) -> BNState | None:
        if self.adapter is None:
            return None
        p, method = self.policy, self._method
        assert method.adapt is not None
        if p.episodic:
            return method.adapt(self.adapter, feeds, p, self.torch_model, Stream())
        if p.reset_every and stream.batches and stream.batches % p.reset_every == 0:
            stream.reset()
        stream.state = method.adapt(self.adapter, feeds, p, self.torch_model, stream)
        stream.batches += 1
        stream.seen += len(next(iter(feeds.values())))
        return stream.state

    def _guard(
        self, feeds: dict[str, np.ndarray], stream: Stream, result: TestTimeResult, before: BNState | None
    ) -> TestTimeResult:
        """The stream guard (:class:`CollapseGuard`), against one plain run of the same examples: on collapse
        the stream goes back to the source; on a label-shifted batch (batch-statistics methods) the stream
        keeps its state from ``before`` the batch -- nothing is learned from it. Either way the source model
        predicts the batch."""
        p = self.policy
        if self.adapter is None or result.probs.ndim != 2:
            return result
        if not p.collapse_threshold and not (p.label_shift_alpha and p.batch_statistics):
            return result
        source = self._run(feeds, None).argmax(-1)  # one plain run: the source's view of the same examples
        with stream.lock:
            if stream.guard is None:
                stream.guard = CollapseGuard(
                    p.collapse_threshold, p.collapse_window, p.label_shift_alpha, p.episodic
                )
            verdict = stream.guard.check(
                result.probs.argmax(-1), source, result.probs.shape[-1], p.batch_statistics
            )
            if verdict is None:
                return result
            reset = verdict == "collapse" and not p.episodic
            if reset:
                stream.reset()
                stream.resets += 1
            elif not p.episodic:
                stream.state = before
        out = self._fallback(feeds, stream, verdict)
        out.reset = reset
        return out

    def _fallback(self, feeds: dict[str, np.ndarray], stream: Stream, reason: str) -> TestTimeResult:
        """The source model's prediction of the batch, counted on the stream."""
        out = self._predict(feeds, None, adapted=False)
        out.fallback = reason
        with stream.lock:
            stream.fallbacks += 1
        return out

    def _correct(self, stream: Stream, result: TestTimeResult) -> TestTimeResult:
        """Prior correction of a classifier's served probabilities by the stream's recent label distribution
        (the source's fallback predictions are served as they are)."""
        if not self.policy.prior_correction or result.probs.ndim != 2:
            return result
        with stream.lock:
            recent = (
                result.probs
                if stream.recent_probs is None
                else np.concatenate([stream.recent_probs, result.probs])
            )
            recent = recent[-max(PRIOR_WINDOW, len(result.probs)) :]
            stream.recent_probs = recent[-PRIOR_WINDOW:]
        if result.fallback is None:
            result.probs = prior_correction(result.probs, recent)
        return result

    def _views_logits(
        self, feeds: dict[str, np.ndarray], state: BNState | None
    ) -> tuple[np.ndarray, int, bool]:
        """Stacked logits (K, B, ...) of every TTA view of the array input, de-augmented where dense."""
        x = feeds[self.input_name]
        n = len(x)
        views, owners, index = make_views(x, self.policy.tta_transforms, self.modality, self.policy.seed)
        shapes = {v.shape for v in views}
        batched = self.dynamic_batch and self.policy.batched and len(shapes) == 1
        if batched:
            big = {k: np.concatenate([v] * len(views)) if _batched(v, n) else v for k, v in feeds.items()}
            big[self.input_name] = np.concatenate(views)
            out, _ = self._forward(big, state)
            logits = out.reshape(len(views), n, *out.shape[1:])
        else:
            logits = np.stack([self._forward({**feeds, self.input_name: v}, state)[0] for v in views])
        if (
            logits.ndim >= 4 and logits.shape[-2:] == x.shape[-2:]
        ):  # dense NCHW output: undo each view's transform
            bad = sorted({t.name for t in owners if not t.invertible})
            if bad:
                raise TestTimeError(f"dense outputs need invertible TTA transforms; {bad} cannot be undone")
            logits = np.stack([t.invert(y, i) for y, t, i in zip(logits, owners, index, strict=True)])
        return logits, len(views), batched

    def _restored(
        self, feeds: dict[str, np.ndarray], stream: Stream
    ) -> tuple[dict[str, np.ndarray], Readings]:
        """(``feeds`` with the image input denoised and sharpened (``denoise.py``) where the engine has the
        source's record, each example's excess noise and detail deficit as given where it was denoised and
        sharpened: None otherwise). The sharpening opens with the ``stream``'s mean detail deficit
        (:meth:`_sharpening`)."""
        noise, x = self._noise, feeds[self.input_name]
        if noise is None or not measurable(x.shape) or not np.issubdtype(x.dtype, np.floating):
            return feeds, (None, None)
        out, excess, deficit = restore_measured(x, noise, self._sharpening(stream))
        return (feeds if out is x else {**feeds, self.input_name: out}), (excess, deficit)

    @staticmethod
    def _sharpening(stream: Stream) -> Callable[[np.ndarray], float]:
        """The share of the sharpening a batch gets: shut while the stream's mean detail deficit (its memory's
        entries and the batch's examples) is below ``memory.BLUR_GATE``, fully open at twice it. A mild blur
        costs plain half a point on the pipeline's digits networks; sharpened example by example, a blur-2
        stream scattered from a point below plain to two above, and class-ordered ones fell 6 of 597 digits
        below it, while a blur of 4, which costs 10 points, reads past twice the gate (the design record,
        ``docs/test-time-design.md``, item 21). The memory is read only when a batch is sharpened: a record that
        only denoises never asks."""

        def opened(deficit: np.ndarray) -> float:
            with stream.lock:
                bank = stream.bank
                size = bank.size if bank is not None else 0
                held = bank.deficit_level * size if size else 0.0
            return opening((held + float(deficit.sum())) / (size + len(deficit)), BLUR_GATE)

        return opened

    def run(self, feeds: dict[str, np.ndarray], stream: Stream | None = None) -> TestTimeResult:
        """Predict one batch with the policy; returns probabilities and what was spent. The adapted model
        sees the inputs restored (denoised or sharpened, where the engine has the source's record); the source
        model, served by the guards, sees them as given."""
        missing = [name for name in self._input_names if name not in feeds]
        if missing:
            raise InferenceError(f"missing model inputs {missing}; the model takes {self._input_names}")
        if len(feeds[self.input_name]) == 0:
            raise InferenceError("empty batch: no examples to predict", hint="give at least one example")
        stream = stream if stream is not None else Stream()  # no stream: nothing is carried over
        p = self.policy
        if self._prior is not None:
            seen, readings = self._restored(feeds, stream)
            return self._correct(stream, self._run_memory(seen, stream, feeds, readings))
        if self.adapter is not None and p.batch_statistics and p.label_shift_alpha:
            if len(feeds[self.input_name]) < MIN_BATCH:  # too few examples for their own statistics
                return self._correct(stream, self._fallback(feeds, stream, "small batch"))
        # after the fallback, which serves the source the batch as given
        seen, _ = self._restored(feeds, stream)
        if p.episodic:  # nothing shared: concurrent calls adapt independently
            before, state = None, self._adapt(seen, stream)
        else:
            with stream.lock:
                before = stream.state
                state = self._adapt(seen, stream)
        return self._correct(stream, self._guard(feeds, stream, self._predict(seen, state), before))

    # ---------------------------------------------------------------------------------- memory statistics

    def _memory_state(
        self,
        bank: StatisticsMemory | None,
        n: int,
        affine: BNState | None,
        labels: LabelHistory | None = None,
        first: list[float] | None = None,
        prior: StatisticsPrior | None = None,
    ) -> BNState:
        """The robust statistics for a batch of ``n``: the source blended with the memory in every layer, and
        the batch's own mixed into the stem layers (weights: examples; the source counts ``stem_prior``);
        ``labels``: the stream's predicted classes, whose time correlation sets how the deep layers count the
        memory's classes (:meth:`StatisticsPrior.coverage`) and how far a batch of ``MIN_BATCH`` or more counts
        in the stem: where they arrive correlated, such a batch is a run of one or two classes, not a sample of
        the stream, and its own statistics would normalise its classes' stem signature away, so it counts only
        as far as the stem's own shift opens its gate (a contrast or blur loss, which each batch reads afresh;
        the memory, class-balanced, and the source set the stem where the stem sees none, clean data or noise
        the restoration took out). A smaller batch weighs little beside the memory and keeps its weight,
        sparing it the label test, down to ``MIN_STEM_WEIGHT`` (below it none: one example, 1 / 145);
        ``first``: with no memory, the stem variances' gates (:meth:`StatisticsPrior.first_gates`; None:
        open); ``prior``: the stream's own (its deep variances measured against the source's anchors,
        :meth:`_measure`; None: the engine's)."""
        adapter, prior = self.adapter, prior or self._prior
        assert adapter is not None and prior is not None
        count = bank.size if bank is not None else 0
        weight = n / (n + count + self.policy.stem_prior)
        if weight < MIN_STEM_WEIGHT:
            weight = 0.0
        if count:
            own = prior.first_gates(bank)  # type: ignore[arg-type]
            gates = prior.gates(bank, own) if prior.gated else None  # type: ignore[arg-type]
            num_classes = bank.num_classes  # type: ignore[union-attr]
            correlated: bool | Callable[[], bool]
            if n >= MIN_BATCH:  # a run of one or two classes counts as far as the stem's own shift is seen
                correlated = labels is not None and labels.correlated(num_classes)
                weight *= max(own, default=1.0) if correlated else 1.0
            else:  # a few examples weigh little beside the memory: the label test only where the class count asks
                correlated = (lambda: labels.correlated(num_classes)) if labels is not None else False
            mean, var = prior.blend(bank, gates, correlated)  # type: ignore[arg-type]
            state = adapter.statistics_feeds(mean, var, weight, gates)
        elif prior is self._prior:  # the source's statistics: the graph's own
            state = adapter.statistics_feeds(None, None, weight, first)
        else:
            state = adapter.statistics_feeds(prior.mean, prior.var, weight, first)
        if affine:
            state.update(affine)
        return state

    def _first(self, stream: Stream) -> bool:
        """Whether the stream's next batch is its first with a gated stem: no memory to measure the gate on."""
        return not self.policy.episodic and stream.bank is None and bool(self._prior and self._prior.gated)

    def _first_state(
        self,
        n: int,
        affine: BNState | None,
        gates: list[float] | None = None,
        prior: StatisticsPrior | None = None,
    ) -> BNState:
        """A stream's first batch's statistics: the stem's variances the source's (shut), or as far as the
        ``gates`` its own shift opens (:meth:`StatisticsPrior.first_gates`); ``prior``: the stream's own."""
        assert self._prior is not None
        return self._memory_state(None, n, affine, first=gates or [0.0] * len(self._prior.gated), prior=prior)

    @staticmethod
    def _stream_prior(stream: Stream) -> StatisticsPrior | None:
        """The stream's own prior (:meth:`_measure`), or None: the engine's."""
        return stream.prior[1] if stream.prior is not None else None

    def _measure(self, stream: Stream, state: BNState, noise: float, clock: int) -> None:
        """The stream's own prior (``anchors.py``): as far as its inputs' excess ``noise`` opens it
        (``NOISE_OPEN``), the deeper layers' source variances replaced by the anchors' measured under
        ``state`` (the stem with the given statistics alone), scaled by how the stream's last examples differ
        from the anchors of their predicted classes; and the deep means moved by the examples' mean difference
        from those anchors, as far as the memory does not yet support the classes (:func:`~.anchors.means_fade`)
        and, where the window's examples run again (batches of ``MIN_BATCH`` or more), as far as they were
        predicted as several classes (:func:`~.anchors.classes_share`) -- on a first batch, measured on itself
        before it is predicted, ``FIRST_MEANS`` of the way, read in a second pass under the variances just
        measured (:meth:`_first_batch_means`). One pass runs the anchors and the window's inputs; a small
        batch's rows are its own pass's (``ShiftWindow``). Where nothing opens it, no pass: the engine's prior.
        Measured again once the stream has seen as many examples since as it had (at least the examples
        measured, at most ``LONGEST``): ``clock``, the examples its memory took so far."""
        anchors, adapter, prior, window = self._anchors, self.adapter, self._prior, stream.window
        assert anchors is not None and adapter is not None and prior is not None and window is not None
        due = clock + min(max(len(window), clock), LONGEST)
        inputs, rows, classes = window.parts()
        window.measured()
        share = opening(noise, NOISE_OPEN)
        if not share:  # no noise to measure
            stream.prior = (due, prior)
            return
        x = anchors.x if inputs is None else np.concatenate([inputs, anchors.x])
        logits, out, _ = adapter.run_with_statistics(
            {self.input_name: x}, adapter.unmixed(state), self.output_name
        )
        k = len(x) - len(anchors.x)
        if k:
            rows = out[:k] if rows is None else np.concatenate([rows, out[:k]])
            measured = _classes(logits[:k])
            classes = measured if classes is None else np.concatenate([classes, measured])
        assert rows is not None and classes is not None
        comparison = AnchorComparison(rows, classes, out[k:], anchors.labels, self._deep)
        var = comparison.variances(prior.var)
        if var is None:
            stream.prior = (due, prior)
            return
        mean, fade = None, 0.0
        if clock and stream.bank is not None:
            mean, fade = comparison.means(prior.mean), means_fade(stream.bank.support)
            if k:  # the window's examples, run again: as far as they were read off several classes
                fade *= classes_share(classes)
        elif k and self._first_means:  # a first batch, measured on itself: means read under its variances
            moved = prior.with_deep_moments(var, share)
            mean, fade = self._first_batch_means(x, k, moved, state), self._first_means
        stream.prior = (due, prior.with_deep_moments(var, share, mean, share * fade))

    def _first_batch_means(
        self, x: np.ndarray, k: int, moved: StatisticsPrior, state: BNState
    ) -> np.ndarray | None:
        """A first batch's deep means (:meth:`_measure`): its ``k`` examples and the anchors (the rest of ``x``)
        run again with the deep variances the first reading measured (``moved``), and the examples' mean
        difference from the anchors of the classes predicted there: under the source's deep variances, whose
        shift is measured, a noisy example's class is too often wrong for its difference to be a shift."""
        adapter, anchors = self.adapter, self._anchors
        assert adapter is not None and anchors is not None
        feeds = {**adapter.unmixed(state), **adapter.statistics_feeds(moved.mean, moved.var, 0.0)}
        logits, out, _ = adapter.run_with_statistics({self.input_name: x}, feeds, self.output_name)
        again = AnchorComparison(out[:k], _classes(logits[:k]), out[k:], anchors.labels, self._deep)
        return again.means(moved.mean)

    def _measure_due(self, stream: Stream) -> bool:
        """Whether the stream measures its shift (again): the model records anchors, the stream has
        ``MIN_EXAMPLES`` examples in its window, and it is due (:meth:`_measure`)."""
        if self._anchors is None or stream.window is None or stream.bank is None:
            return False
        return len(stream.window) >= MIN_EXAMPLES and (
            stream.prior is None or stream.bank.clock >= stream.prior[0]
        )

    def _window(
        self, stream: Stream, x: np.ndarray, noise: np.ndarray | None, affine: BNState | None, first: bool
    ) -> bool:
        """Whether the batch's rows go to the stream's window after its pass (a batch smaller than
        ``MIN_BATCH``; a larger one's inputs go now): a batch of another size than the anchors' is not
        measured. A first batch of ``MIN_EXAMPLES`` or more measures its own shift before it is predicted
        (:meth:`_measure`): a class-ordered stream's first class is the one the source's deep variances cost
        most."""
        assert self._anchors is not None
        if x.shape[1:] != self._anchors.x.shape[1:]:
            return False
        if stream.window is None:
            stream.window = ShiftWindow(WINDOW)
        if len(x) < MIN_BATCH:
            return True
        stream.window.push_inputs(x)
        if stream.bank is None and stream.prior is None and len(x) >= MIN_EXAMPLES and noise is not None:
            n = len(x)
            state = self._first_state(n, affine) if first else self._memory_state(None, n, affine)
            self._measure(stream, state, float(noise.mean()), 0)
        return False

    def _statistics(self, stream: Stream, n: int) -> BNState:
        """The stream's robust statistics for a batch of ``n``, recomputed once the memory has taken
        ``REFRESH_EXAMPLES`` examples since (every batch of that many or more), or when the batch size or the
        affine parameters changed: at batch size 1 the blend costs more than the memory moves (1/64 an
        example). Where it is due, the stream's shift is measured against the source anchors first
        (:meth:`_measure`), under the statistics the last batch ran with."""
        bank, cached = stream.bank, stream.statistics
        clock = bank.clock if bank is not None else -REFRESH_EXAMPLES
        if cached is not None:
            since, size, affine, state = cached
            if size == n and affine is stream.state and clock - since < REFRESH_EXAMPLES:
                return state
            if self._measure_due(stream):  # under the statistics the last batch ran with
                assert bank is not None
                self._measure(stream, state, bank.noise_level, clock)
        state = self._memory_state(bank, n, stream.state, stream.labels, prior=self._stream_prior(stream))
        stream.statistics = (clock, n, stream.state, state)
        return state

    def _run_memory(
        self,
        feeds: dict[str, np.ndarray],
        stream: Stream,
        source_feeds: dict[str, np.ndarray],
        readings: Readings = (None, None),
    ) -> TestTimeResult:
        """One batch with the memory statistics: one pass predicts and reports every example's statistics
        (a gradient method's step and a second pass in between); the stream's memory then takes them, with
        each example's excess noise and detail deficit (``readings``, :meth:`_restored`). ``source_feeds``:
        the batch as given, for the collapse guard's source model.

        A stream's first batch has no memory to measure a shift on: its stem variances stay the source's
        unless the batch's own statistics show one (:meth:`StatisticsPrior.first_gates`), and then it runs a
        second time with them (unless they weigh nothing there, ``MIN_STEM_WEIGHT``): with the gates open by
        default, a class-ordered stream's first batch, one class, normalised its class away in the stem
        (``memory.py``)."""
        adapter, p, prior = self.adapter, self.policy, self._prior
        assert adapter is not None and prior is not None
        n = len(feeds[self.input_name])
        with stream.lock:
            continual = not p.episodic
            bank = stream.bank if continual else None
            affine = stream.state
            first = self._first(stream)
            keep_rows = False
            if continual and self._anchors is not None:
                keep_rows = self._window(stream, feeds[self.input_name], readings[0], affine, first)
            own = self._stream_prior(stream)
            if first:
                state = self._first_state(n, affine, prior=own)
            else:
                state = self._statistics(stream, n) if continual else self._memory_state(None, n, None)
            logits, stats, state = self._adapted_pass(feeds, state, stream)
            if first and adapter.mixes(state) and any(gates := prior.first_gates(stats)):
                # a shift: the batch again, its stem variances mixing in the batch's
                state = self._first_state(n, affine, gates, own)
                logits, stats, _ = adapter.run_with_statistics(feeds, state, self.output_name)
            classes = _classes(logits)
            if continual:
                if bank is None:
                    classes_out = logits.shape[1] if logits.ndim == 2 and logits.shape[1] > 1 else 1
                    bank = stream.bank = StatisticsMemory(p.memory_size, stats.shape[1], classes_out)
                bank.add(stats, classes, *readings)
                if keep_rows and stream.window is not None:
                    stream.window.push_rows(stats, classes)
                if stream.labels is None:
                    stream.labels = LabelHistory()
                stream.labels.push(classes)
                stream.batches += 1
                stream.seen += n
            suspect = self._suspects(stream, classes, logits)
        if p.tta_transforms or p.mc_dropout:
            result = self._predict(feeds, state, adapted=True)
        else:
            result = TestTimeResult(softmax(logits, 1 if logits.ndim == 4 else -1), adapted=True)
        return self._judge(source_feeds, stream, result) if suspect else result

    def _adapted_pass(
        self, feeds: dict[str, np.ndarray], state: BNState, stream: Stream
    ) -> tuple[np.ndarray, np.ndarray, BNState]:
        """(output, every example's statistics, the state it ran with): one pass. For a gradient method on a
        batch of ``min_batch`` or more the pass also fetches the graph tail's inputs; the stream gathers a
        sample of them and steps once per ``STEP_EXAMPLES`` (``tail.py``): the step serves the next batches.
        Episodic policies have no next batch: they step on the whole batch and predict it with a second pass."""
        adapter, p, tail, method = self.adapter, self.policy, self._tail, self._method
        assert adapter is not None
        if tail is None or method.step is None or len(feeds[self.input_name]) < method.min_batch:
            logits, stats, _ = adapter.run_with_statistics(feeds, state, self.output_name)
            return logits, stats, state
        n = len(feeds[self.input_name])
        logits, stats, fetched = adapter.run_with_statistics(feeds, state, self.output_name, tail.fetch)
        if p.episodic:  # no next batch: step on this one, predict it again
            inputs = dict(zip(tail.inputs, tail.gather(feeds, fetched), strict=True))
            state = {**state, **self._step(method, inputs, state, fetched, stream)}
            return adapter.run(feeds, state, [self.output_name])[0], stats, state
        if stream.tail is None:
            stream.tail = TailBuffer()
        stream.tail.add(tail.gather(feeds, fetched), n)
        if stream.tail.due:
            inputs = stream.tail.take(tail)
            stream.state = {**(stream.state or {}), **self._step(method, inputs, state, fetched, stream)}
        return logits, stats, state

    def _step(
        self,
        method: AdaptationMethod,
        inputs: dict[str, np.ndarray],
        state: BNState,
        fetched: list[np.ndarray],
        stream: Stream,
    ) -> BNState:
        """A gradient step of the tail's scale/bias on ``inputs`` under the statistics of the newest pass."""
        adapter, tail = self.adapter, self._tail
        assert adapter is not None and tail is not None and method.step is not None
        current = {**adapter.source_state, **state}
        values, params = tail.statistics(current, fetched), tail.parameters(current)
        return method.step(tail, inputs, self.policy, values, params, stream)

    def _suspects(self, stream: Stream, classes: np.ndarray, logits: np.ndarray) -> bool:
        """The collapse guard's lazy check (the stream's lock held): the source model is run on a batch only
        while the adapted predictions look collapsed (:meth:`CollapseGuard.suspects`)."""
        p = self.policy
        if not p.collapse_threshold or logits.ndim != 2:
            return False
        if stream.guard is None:
            stream.guard = CollapseGuard(p.collapse_threshold, p.collapse_window, 0.0, p.episodic)
        return stream.guard.suspects(classes, logits.shape[-1])

    def _judge(self, feeds: dict[str, np.ndarray], stream: Stream, result: TestTimeResult) -> TestTimeResult:
        """A suspected batch: the source predicts it too; on a collapse (narrower than the source on the same
        examples) the stream is reset and the source's prediction is served."""
        source = self._predict(feeds, None, adapted=False)
        num_classes = result.probs.shape[-1]
        with stream.lock:
            guard = stream.guard
            assert guard is not None
            if not guard.judge(result.probs.argmax(-1), source.probs.argmax(-1), num_classes):
                return result
            reset = not self.policy.episodic
            if reset:
                stream.reset()
                stream.resets += 1
            stream.fallbacks += 1
        source.fallback, source.reset = "collapse", reset
        return source

    def _predict(
        self, feeds: dict[str, np.ndarray], state: BNState | None, adapted: bool | None = None
    ) -> TestTimeResult:
        adapted = state is not None if adapted is None else adapted
        if not self.policy.tta_transforms:
            logits, uncertainty = self._forward(feeds, state)
            return TestTimeResult(softmax(logits, 1 if logits.ndim == 4 else -1), 1, 0, adapted, uncertainty)
        if self.modality == "text":
            raise TestTimeError("text TTA works on strings: call predict_texts(texts, processor)")
        if self.policy.adaptive_threshold is not None:
            return self._adaptive(feeds, state, adapted)
        views, k, batched = self._views_logits(feeds, state)
        probs = aggregate(views, self.policy.tta_aggregate, 1 if views.ndim == 5 else -1)
        return TestTimeResult(probs, k, len(probs), adapted, None, batched)

    def _adaptive(self, feeds: dict[str, np.ndarray], state: BNState | None, adapted: bool) -> TestTimeResult:
        """Augment only the rows whose plain prediction is less confident than the threshold."""
        logits, uncertainty = self._forward(feeds, state)
        probs = softmax(logits, -1)
        low = np.flatnonzero(probs.max(axis=-1) < self.policy.adaptive_threshold)
        k, batched = 1, True
        if len(low):
            n = len(probs)
            sub = {key: v[low] if _batched(v, n) else v for key, v in feeds.items()}
            views, k, batched = self._views_logits(sub, state)
            probs = probs.copy()
            probs[low] = aggregate(views, self.policy.tta_aggregate, -1)
        return TestTimeResult(probs.astype(np.float32), k, len(low), adapted, uncertainty, batched)

    def adapted_model(self, feeds: dict[str, np.ndarray], stream: Stream | None = None) -> onnx.ModelProto:
        """A copy of the model with the adaptation of this batch written into its initializers (to save or
        ship): run plainly it predicts the batch as :meth:`run` would on ``stream`` (default: a fresh one,
        which is not changed). Input restoration is not part of a graph: the statistics are those of the
        batch as given, and the copy takes inputs as they are; so a fresh stream's first batch, whose noise
        the restoration reads, is not measured against the source anchors here (a stream that has been is)."""
        adapter = self.adapter
        if adapter is None:
            raise TestTimeError("the policy adapts nothing (ttt=none); use ttt='bn' or 'tent'")
        if self._prior is None:
            return adapter.adapted_model(self._adapt(feeds, Stream()) or {})
        stream = stream if stream is not None else Stream()
        n = len(feeds[self.input_name])
        with stream.lock:
            own = self._stream_prior(stream)
            if self._first(stream):  # the gates the batch's own statistics open, as run measures them
                shut = self._first_state(n, stream.state, prior=own)
                stats = adapter.run_with_statistics(feeds, shut, self.output_name)[1]
                state = self._first_state(n, stream.state, self._prior.first_gates(stats), own)
            else:
                state = self._memory_state(stream.bank, n, stream.state, stream.labels, prior=own)
            scratch = Stream(state=stream.state, memory=dict(stream.memory))
        _, _, state = self._adapted_pass(feeds, state, scratch)
        mixed = adapter.run(feeds, state, [t for i in adapter.mixed for t in mixed_statistics(i)])
        values = {k: v for k, v in state.items() if k in adapter.source_state}
        for k, i in enumerate(adapter.mixed):
            values[adapter.layers[i].mean], values[adapter.layers[i].var] = mixed[2 * k], mixed[2 * k + 1]
        return adapter.adapted_model(values)

    def predict(self, feeds: dict[str, np.ndarray], stream: Stream | None = None) -> np.ndarray:
        """Probabilities (N, C) (dense outputs: (N, C, H, W))."""
        return self.run(feeds, stream).probs

    def predict_texts(self, texts: list[str], processor: Callable[..., dict[str, np.ndarray]]) -> np.ndarray:
        """Text TTA: augment the strings, tokenize all views in one processor call, run them as one batch."""
        names = self.policy.tta_transforms or ("identity",)
        views, _, _ = make_views(list(texts), names, "text", self.policy.seed)
        flat = [t for view in views for t in view]
        feeds = processor(texts=flat)
        feeds = {i.name: feeds[i.name] for i in self.inputs if i.name in feeds}
        stream = Stream()
        if self._prior is not None:
            state: BNState | None = self._memory_state(None, len(next(iter(feeds.values()))), None)
        else:
            state = self._adapt(feeds, stream) if self.adapter else None
        out, _ = self._forward(feeds, state)
        logits = out.reshape(len(views), len(texts), *out.shape[1:])
        return aggregate(logits, self.policy.tta_aggregate, -1)


def calibrate_restoration(
    model: ModelLike,
    train: np.ndarray,
    held_out: np.ndarray,
    labels: np.ndarray,
    seed: int = 0,
    providers: list[str] | tuple[str, ...] | None = None,
) -> InputNoise:
    """An image model's ``modelexport.input_noise`` record (:func:`denoise.calibrate`), its strengths judged
    where restoration runs: before adaptation. Each calibration set, one i.i.d. batch of ``held_out`` images,
    is predicted with its own BN statistics (``bn-exact``), the statistics adaptation tends to on such data;
    a model without BN layers, which no method adapts, as it runs."""
    source = load_model(model)
    policy = POLICY_PRESETS["bn-exact"] if find_bn_layers(source) else TestTimePolicy()
    engine = TestTimeEngine(source, policy.with_changes(denoise=0.0, sharpen=0.0), providers)

    def predict(x: np.ndarray) -> np.ndarray:
        return engine.predict({engine.input_name: x}).argmax(-1)

    return calibrate(train, held_out, labels, predict, seed)


def calibrate_anchors(
    model: ModelLike,
    anchors: SourceAnchors,
    held_out: np.ndarray,
    labels: np.ndarray,
    seed: int = 0,
    providers: list[str] | tuple[str, ...] | None = None,
) -> bool:
    """Whether an image model that records its input noise (``modelexport.input_noise``) gains from measuring
    a noisy stream's deep variances against ``anchors`` (``anchors.py``): the default ``--ttt bn``'s mean
    accuracy over class-ordered streams of ``held_out`` images in batches of ``CALIBRATION_BATCH``, with the
    Gaussian noise the restoration's strengths are judged on (``denoise.noisy_levels``), is higher with them
    than without (the same where the record denoises nothing: nothing is measured). The estimate assumes noise
    moves a deep layer's variance alike for every class; on the pipeline's digits networks it held (noise 3
    and 4 read class by class: +1 to +5 points), on its shapes network it did not (-1 to -1.7), and this is
    where the pipeline tells the two apart. It judges the variances alone, a first batch's means left out
    (``FIRST_MEANS``, measured on the networks this judgement kept): with them, the tests' digits and shapes
    CNNs, which it refuses, would pass on one noise level's gain."""
    source = load_model(model)
    if not find_bn_layers(source):  # nothing adapts: nothing to measure
        return False
    measured = TestTimeEngine(source, TestTimePolicy(ttt="bn"), providers)
    if not measured._takes_anchors():
        return False
    measured._anchors, measured._first_means = measured._as_input(anchors), 0.0
    unmeasured = TestTimeEngine(source, TestTimePolicy(ttt="bn", anchors=False), providers)
    order = StreamOrder("class-sorted").indices(labels)
    y = np.asarray(labels)[order]

    def accuracy(engine: TestTimeEngine, x: np.ndarray) -> float:
        stream = engine.new_stream()
        batches = range(0, len(x), CALIBRATION_BATCH)
        preds = [engine.predict({engine.input_name: x[i : i + CALIBRATION_BATCH]}, stream) for i in batches]
        return float((np.concatenate(preds).argmax(-1) == y).mean())

    noisy = noisy_levels(held_out[order], seed)
    gain = [accuracy(measured, x) - accuracy(unmeasured, x) for x in noisy]
    return float(np.mean(gain)) > 0.0


def _classes(logits: np.ndarray) -> np.ndarray:
    """The predicted classes that key the statistics memory (a classifier's; one key for other outputs)."""
    if logits.ndim == 2 and logits.shape[1] > 1:
        return logits.argmax(-1)
    return np.zeros(len(logits), np.int64)


def _batched(value: np.ndarray, n: int) -> bool:
    return getattr(value, "ndim", 0) >= 1 and len(value) == n
