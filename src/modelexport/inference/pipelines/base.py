"""``ONNXPipeline``: batches -> processor -> session -> the output format of the transformers pipeline.

Tasks join :data:`PIPELINES` with :func:`register_pipeline`. Each names the processor kinds it accepts
and the transformers pipeline argument its processor plays (``tokenizer``, ``image_processor``,
``feature_extractor``), which is how :func:`create_pipeline` routes a ``data_processor``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..._numeric import softmax
from ..._registry import Registry
from ...errors import ConfigError, InferenceError, TaskDetectionError
from ...metadata.schema import KEY_MODEL_CONFIG, KEY_TEST_TIME_ENSEMBLE, KEY_TEST_TIME_POLICY
from ...onnxfile import resolve_model_path
from ...runtime.session import SessionConfig, SessionInfo
from ...testtime.engine import TestTimeEngine
from ...testtime.ensemble import merge_probabilities
from ...testtime.iterative import Iteration
from ...testtime.policy import TestTimePolicy
from ...testtime.streams import Stream
from ..processors import BaseONNXProcessor

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = ["ONNXPipeline", "PIPELINES", "register_pipeline", "sigmoid"]

log = logging.getLogger(__name__)

PIPELINES: Registry[type[ONNXPipeline]] = Registry("pipeline task", error=TaskDetectionError)


def register_pipeline(task: str) -> Callable[[type[ONNXPipeline]], type[ONNXPipeline]]:
    """Class decorator: the pipeline for ``task`` (which it also records as the class's ``task``)."""

    def deco(cls: type[ONNXPipeline]) -> type[ONNXPipeline]:
        cls.task = task
        return PIPELINES.add(task, cls)

    return deco


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class ONNXPipeline:
    """One task on one ONNX Runtime session; call it with one input or a list (run in ``batch_size`` batches)."""

    task: ClassVar[str] = ""
    #: Processor kinds this task accepts, and the transformers pipeline argument the processor plays.
    processor_kinds: ClassVar[tuple[str, ...]] = ("tokenizer",)
    processor_arg: ClassVar[str] = "tokenizer"
    #: Whether the pipeline generates tokens (takes --max-new-tokens, --num-beams, ...).
    generates: ClassVar[bool] = False

    def __init__(
        self,
        session: InferenceSession,
        processor: BaseONNXProcessor,
        *,
        metadata: dict[str, Any],
        session_info: SessionInfo | None = None,
        model_path: Path | None = None,
        batch_size: int = 1,
        test_time_policy: TestTimePolicy | dict[str, Any] | bool | None = None,
        session_config: SessionConfig | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if processor.kind not in self.processor_kinds:
            raise ConfigError(
                f"{self.task} needs a {' or '.join(self.processor_kinds)}, got a {processor.kind} ({type(processor).__name__})"
            )
        self.session, self.session_info, self.processor = session, session_info, processor
        self.metadata, self.model_path, self.batch_size = metadata, model_path, batch_size
        self.model_config: dict[str, Any] = dict(metadata.get(KEY_MODEL_CONFIG) or processor.config or {})
        self._labels: dict[int, str] | None = None
        self.output_names = [o.name for o in session.get_outputs()]
        self.session_config = session_config or SessionConfig()
        self.policy = self._policy(test_time_policy)
        self._engine: TestTimeEngine | None = None
        #: Seconds of each load stage (``metadata``, ``session``, ``processor``, ``pipeline``) when made by
        #: :func:`~.factory.pipeline`.
        self.load_seconds: dict[str, float] = {}
        #: The pipeline's adaptation stream: a continual policy adapts along everything this pipeline
        #: predicts (one pipeline per independent stream of inputs).
        self.test_time_stream = Stream()
        #: Other models whose probabilities are averaged with this one's, and iterative inference of each
        #: batch (``configure_test_time``; classifiers).
        self.ensemble: list[Path] = self._stored_ensemble(test_time_policy)
        self.iteration: Iteration | None = None
        self._members: list[tuple[TestTimeEngine, Stream]] | None = None

    # ---------------------------------------------------------------------------------------------- labels
    @property
    def id2label(self) -> dict[int, str]:
        if self._labels is None:
            self._labels = {int(k): str(v) for k, v in (self.model_config.get("id2label") or {}).items()}
        return self._labels

    def label(self, index: int) -> str:
        return self.id2label.get(int(index), f"LABEL_{int(index)}")

    # ------------------------------------------------------------------------------------------ test time
    def _policy(self, given: TestTimePolicy | dict[str, Any] | bool | None) -> TestTimePolicy | None:
        """The test-time policy: the argument, else the one embedded in the metadata (False disables it)."""
        raw = self.metadata.get(KEY_TEST_TIME_POLICY) if given is None else given
        if raw is None or raw is False:
            return None
        policy = raw if isinstance(raw, TestTimePolicy) else TestTimePolicy.from_dict(dict(raw))
        return None if policy.is_plain else policy

    def _stored_ensemble(self, given: TestTimePolicy | dict[str, Any] | bool | None) -> list[Path]:
        """The ensemble the metadata names (files beside the model), unless test-time compute is off."""
        stored = self.metadata.get(KEY_TEST_TIME_ENSEMBLE)
        if given is False or not stored or self.model_path is None:
            return []
        return [Path(self.model_path).parent / str(name) for name in stored.get("members", [])]

    def member_engines(self) -> list[tuple[TestTimeEngine, Stream]]:
        """The ensemble's other models, each an engine under this pipeline's policy with its own stream."""
        if self._members is None:
            self._members = [
                (TestTimeEngine(m, self.policy, session_config=self.session_config), Stream())
                for m in self.ensemble
            ]
        return self._members

    def configure_test_time(
        self, ensemble: Sequence[str | os.PathLike[str]] = (), iteration: Iteration | None = None
    ) -> None:
        """An ensemble (other models, e.g. the int8 twin, each under this pipeline's policy, their
        probabilities averaged with this model's) and iterative inference of each batch (a plain policy)."""
        if iteration is not None and self.policy is not None:
            raise ConfigError(
                "iterative inference runs the model as it is; this model embeds a test-time policy",
                hint="drop --iterate, or pass a model without a policy",
            )
        self.ensemble = [resolve_model_path(m) for m in ensemble] or self.ensemble
        self.iteration = iteration
        self._engine, self._members = None, None

    def test_time_engine(self) -> TestTimeEngine:
        """The test-time engine applying the policy (built once, on first use).

        It shares this pipeline's session when the policy runs the model as it is (TTA), and otherwise
        builds its one session of the rewritten graph with this pipeline's :class:`SessionConfig` (with
        ``--loop onnx``, the ONNX Loop of the iterations).
        """
        if self._engine is None:
            looped = self.iteration is not None and self.iteration.loop == "onnx"
            self._engine = TestTimeEngine(
                self.iteration.model(self.model_path) if looped else self.model_path,  # type: ignore[union-attr]
                self.policy,
                session_config=self.session_config,
                session=None if looped else self.session,
                session_info=None if looped else self.session_info,
            )
        return self._engine

    def _test_time_probabilities(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Probabilities through the engine: iterated when configured, averaged over the ensemble."""
        engine = self.test_time_engine()
        if self.iteration is not None:
            out = self.iteration.run(engine, feeds, self.test_time_stream)
        else:
            out = engine.run(feeds, self.test_time_stream)
        probs = [out if isinstance(out, np.ndarray) else out.probs]
        probs += [m.predict(feeds, stream) for m, stream in self.member_engines()]
        return merge_probabilities(probs) if len(probs) > 1 else probs[0]

    # -------------------------------------------------------------------------------------------- running
    def forward(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session; a graph with a fixed batch gets its batch padded, outputs are cut back."""
        n = len(next(iter(feeds.values())))
        fixed = self.processor.fixed_batch
        if fixed and n < fixed:
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], fixed - n, axis=0)]) for k, v in feeds.items()}
        try:
            outputs = self.session.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
            shapes = {k: list(v.shape) for k, v in feeds.items()}
            raise InferenceError(
                f"ONNX Runtime failed on inputs {shapes}: {type(exc).__name__}: {exc}"
            ) from exc
        return {
            name: out[:n] if fixed and n < fixed else out
            for name, out in zip(self.output_names, outputs, strict=True)
        }

    def _batches(self, items: list[Any], batch_size: int) -> Iterator[list[Any]]:
        size = min(batch_size, self.processor.fixed_batch or batch_size)
        for start in range(0, len(items), size):
            yield items[start : start + size]

    def normalize(self, inputs: object, kwargs: dict[str, Any]) -> tuple[list[Any], bool]:
        """(items, whether one input was given); a task may take its inputs from ``kwargs`` (and pop them)."""
        if inputs is None:
            raise InferenceError(f"{self.task} pipeline called without inputs")
        single = not isinstance(inputs, (list, tuple))
        return ([inputs] if single else list(inputs)), single

    def __call__(self, inputs: object = None, *, batch_size: int | None = None, **kwargs: object) -> Any:
        """The task's output for one input (a text, an image...) or a list of them; ``kwargs`` are the task's
        options (``top_k``, ``max_new_tokens``...), given to :meth:`run_batch` and :meth:`format`."""
        items, single = self.normalize(inputs, kwargs)
        if not items:
            return []
        results: list[Any] = []
        for batch in self._batches(items, batch_size or self.batch_size):
            results.extend(self.run_batch(batch, **kwargs))
        return self.format(results, single, **kwargs)

    # format, run_batch and run_feeds take ``**kwargs: Any``: each task's override names its own options with
    # their types (``top_k: int | None``...), which a base typed ``object`` would forbid.
    def format(self, results: list[Any], single: bool, **kwargs: Any) -> Any:
        return results[0] if single else results

    def run_batch(self, items: list[Any], **kwargs: Any) -> list[Any]:
        raise NotImplementedError

    #: Whether :meth:`run_feeds` takes model-ready feeds: False where the outputs need the raw inputs
    #: (token offsets, image sizes, the context of an answer).
    takes_feeds: ClassVar[bool] = False

    def run_feeds(self, feeds: dict[str, np.ndarray], **kwargs: Any) -> list[Any]:
        """One batch of model-ready feeds (what the processor would make) -> this task's outputs."""
        raise ConfigError(
            f"{self.task} needs its raw inputs (texts, images), not model-ready arrays",
            hint="pass the raw inputs, e.g. a CSV of texts or an image folder",
        )

    def from_feeds(
        self, feeds: dict[str, np.ndarray], *, batch_size: int | None = None, **kwargs: object
    ) -> list[Any]:
        """Outputs for model-ready feeds (rows on axis 0, e.g. a ``.npz``), ``batch_size`` rows at a time."""
        n = len(next(iter(feeds.values())))
        results: list[Any] = []
        for rows in self._batches(list(range(n)), batch_size or self.batch_size):
            part = slice(rows[0], rows[-1] + 1)
            results.extend(self.run_feeds({k: v[part] for k, v in feeds.items()}, **kwargs))
        return results

    def describe(self) -> dict[str, Any]:
        info = self.session_info
        return {
            "task": self.task,
            "model": str(self.model_path) if self.model_path else None,
            "provider": getattr(info, "provider", None),
            "processor": self.processor.describe(),
            "test_time_policy": self.policy.to_dict() if self.policy else None,
        }


class ClassificationMixin:
    """Scores like transformers: sigmoid for multi-label or one-logit heads, softmax otherwise; top-k labels."""

    model_config: dict[str, Any]
    label: Callable[[int], str]
    policy: TestTimePolicy | None
    output_names: list[str]
    forward: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    test_time_engine: Callable[[], TestTimeEngine]
    test_time_stream: Stream

    def scores(self, logits: np.ndarray, function_to_apply: str | None = None) -> np.ndarray:
        fn = function_to_apply or (
            "sigmoid"
            if self.model_config.get("problem_type") == "multi_label_classification" or logits.shape[-1] == 1
            else "softmax"
        )
        if fn not in ("softmax", "sigmoid", "none"):
            raise ConfigError(f"function_to_apply must be softmax, sigmoid or none, got {fn!r}")
        x = logits.astype(np.float32)
        return softmax(x) if fn == "softmax" else sigmoid(x) if fn == "sigmoid" else x

    def feed_probabilities(self, feeds: dict[str, np.ndarray], function_to_apply: str | None) -> np.ndarray:
        """Scores of one batch of feeds; with a test-time policy, an ensemble or iterative inference, the
        engine's probabilities."""
        if self.iteration is not None or self.ensemble:
            return self._test_time_probabilities(feeds)
        if self.policy is not None:
            return self.test_time_engine().predict(feeds, self.test_time_stream)
        logits = self.forward(feeds)[self.output_names[0]]
        return self.scores(logits, function_to_apply)

    def ranked(self, row: np.ndarray, top_k: int | None) -> list[dict[str, Any]]:
        order = np.argsort(-row, kind="stable")
        if top_k is not None:
            order = order[:top_k]
        return [{"label": self.label(int(i)), "score": float(row[i])} for i in order]
