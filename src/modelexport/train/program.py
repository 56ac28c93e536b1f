"""The classifier as a DSPy program: ``forward(text=...)`` / ``forward(image=...)`` -> ``dspy.Prediction``.

The same program object is trained (torch backend), then deployed (ONNX Runtime backend, optionally
through a test-time policy engine), so DSPy evaluation, tools and agents use it unchanged throughout.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
import numpy as np

from .._numeric import softmax
from .._progress import progress_bar
from ..data import Dataset
from ..errors import InferenceError
from ..testtime.engine import TestTimeEngine
from ..testtime.ensemble import merge_probabilities
from ..testtime.policy import TestTimePolicy
from .networks import Network

if TYPE_CHECKING:
    from ..testtime.streams import Stream

__all__ = [
    "ClassifierProgram",
    "TorchBackend",
    "OnnxBackend",
    "to_examples",
    "label_accuracy",
    "Metric",
]

#: A backend turns a batch of raw inputs (texts or images) into class probabilities (N, K).
Backend = Callable[[Sequence[Any]], np.ndarray]
#: A DSPy metric: ``metric(example, prediction, trace=None)``, true (or a score) when the prediction is right.
Metric = Callable[..., object]


class TorchBackend:
    """The torch network in eval mode (training and validation)."""

    name = "torch"
    provider = "torch"

    def __init__(self, network: Network) -> None:
        self.network = network

    def __call__(self, inputs: Sequence[Any]) -> np.ndarray:
        import torch

        was_training = self.network.module.training
        self.network.module.eval()
        try:
            with torch.no_grad():
                return softmax(self.network.logits(self.network.encode(inputs)).detach().cpu().numpy())
        finally:
            self.network.module.train(was_training)


class OnnxBackend:
    """An ONNX Runtime session on the exported model, through a test-time policy engine.

    A plain policy is one session run per batch; TTA, BN adaptation or Tent spend more compute as the
    policy says (``modelexport.testtime.TestTimeEngine``). Providers fall back in order, CPU last.
    """

    name = "onnxruntime"

    def __init__(
        self,
        network: Network,
        model_path: str | Path,
        providers: Sequence[str] | None = None,
        policy: TestTimePolicy | None = None,
        ensemble: Sequence[str | Path] = (),
    ) -> None:
        self.network = network
        self.model_path = Path(model_path)
        self.policy = policy or TestTimePolicy()
        self.providers = tuple(providers or ())
        self.engine = TestTimeEngine(self.model_path, self.policy, self.providers)
        #: One stream per deployment: a continual policy adapts along every batch this backend predicts.
        self.stream = self.engine.new_stream()
        #: Other models of an ensemble (e.g. the int8 twin), each with the policy and its own stream; their
        #: probabilities are averaged with the model's (``testtime.ensemble.merge_probabilities``).
        self.ensemble = tuple(str(m) for m in ensemble)
        self.members = [TestTimeEngine(m, self.policy, self.providers) for m in self.ensemble]
        self.member_streams = [m.new_stream() for m in self.members]

    @property
    def provider(self) -> str:
        return self.engine.session_info.provider

    def __call__(self, inputs: Sequence[Any]) -> np.ndarray:
        probs = self._predict(self.engine, self.stream, inputs)
        if not self.members:
            return probs
        others = [self._predict(m, s, inputs) for m, s in zip(self.members, self.member_streams, strict=True)]
        return merge_probabilities([probs, *others])

    def _predict(self, engine: TestTimeEngine, stream: Stream, inputs: Sequence[Any]) -> np.ndarray:
        if engine.modality == "text" and self.policy.tta_transforms:
            return engine.predict_texts(list(inputs), lambda texts: self.network.encode(texts))
        return engine.predict(self._feeds(inputs), stream)

    def _feeds(self, inputs: Sequence[Any]) -> dict[str, np.ndarray]:
        feeds = self.network.encode(inputs)
        names = [i.name for i in self.engine.inputs]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise InferenceError(
                f"{self.model_path.name} needs inputs {missing}; the encoder gave {sorted(feeds)}"
            )
        return {n: feeds[n] for n in names}


def _key(value: object) -> Hashable:
    if isinstance(value, np.ndarray):
        return (value.shape, str(value.dtype), hashlib.blake2b(value.tobytes(), digest_size=16).digest())
    return value


class ClassifierProgram(dspy.Module):
    """A classifier with DSPy's interface; ``backend`` is the torch network or a deployed ONNX model."""

    def __init__(self, network: Network, batch_size: int = 64, progress: bool = False) -> None:
        super().__init__()
        self.network = network
        self.batch_size = batch_size
        self.progress = progress
        self.label_names = [network.id2label[i] for i in range(len(network.id2label))]
        self.label2id = {name: i for i, name in enumerate(self.label_names)}
        self.backend: Backend = TorchBackend(network)
        self._cache: dict[Any, dspy.Prediction] = {}
        self.training_summary: Any = None  # set by TorchWeightOptimizer
        self.policy_search: Any = None  # set by TestTimePolicyOptimizer

    @property
    def input_field(self) -> str:
        return self.network.input_field

    def forward(self, **inputs: object) -> dspy.Prediction:
        """Classify one input given as ``text=...`` or ``image=...``."""
        if self.input_field not in inputs:
            raise InferenceError(f"this program classifies {self.input_field} inputs; got {sorted(inputs)}")
        value = inputs[self.input_field]
        cached = self._cache.get(_key(value))
        return cached if cached is not None else self.predict_batch([value])[0]

    def probabilities(self, inputs: Sequence[Any], batch_size: int | None = None) -> np.ndarray:
        """Class probabilities ``(N, K)`` in batches through the current backend."""
        size = batch_size or self.batch_size
        starts = range(0, len(inputs), size)
        quiet = not self.progress or len(starts) < 8
        parts = [
            self.backend(inputs[i : i + size])
            for i in progress_bar(starts, desc="predict", unit="batch", leave=False, disable=quiet)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.label_names)), np.float32)

    def predict_batch(self, inputs: Sequence[Any], batch_size: int | None = None) -> list[dspy.Prediction]:
        probs = self.probabilities(inputs, batch_size)
        ids = probs.argmax(axis=-1)
        return [
            dspy.Prediction(label=self.label_names[int(i)], label_id=int(i), confidence=float(p[i]))
            for i, p in zip(ids, probs, strict=True)
        ]

    @contextlib.contextmanager
    def prefetched(self, inputs: Sequence[Any]) -> Iterator[None]:
        """Predict ``inputs`` in batches up front so per-example ``forward`` calls (dspy.Evaluate) are cheap."""
        preds = self.predict_batch(inputs)
        self._cache = {_key(x): p for x, p in zip(inputs, preds, strict=True)}
        try:
            yield
        finally:
            self._cache = {}

    def deploy(
        self,
        model_path: str | Path,
        providers: Sequence[str] | None = None,
        policy: TestTimePolicy | None = None,
        *,
        ensemble: Sequence[str | Path] = (),
    ) -> ClassifierProgram:
        """Serve predictions from the exported ONNX model (with a test-time policy, and averaged with the
        ``ensemble`` models when given) from now on."""
        self.backend = OnnxBackend(self.network, model_path, providers, policy, ensemble)
        return self

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The deployed ensemble's other models (empty: the model alone)."""
        return tuple(getattr(self.backend, "ensemble", ()))

    @property
    def policy(self) -> TestTimePolicy | None:
        """The deployed test-time policy (None while the torch network serves)."""
        return getattr(self.backend, "policy", None)

    def accuracy(self, dataset: Dataset | Sequence[dspy.Example]) -> float:
        """Plain batched accuracy (what the report states), without DSPy's per-example overhead."""
        examples = to_examples(dataset) if isinstance(dataset, Dataset) else list(dataset)
        preds = self.predict_batch([ex[self.input_field] for ex in examples])
        return float(np.mean([p.label == ex.label for p, ex in zip(preds, examples, strict=True)]))


def to_examples(dataset: Dataset) -> list[dspy.Example]:
    """``dspy.Example(text=..., label=name).with_inputs("text")`` (or ``image=``) for every row."""
    field = {"text": "text", "image": "image", "tensor": "x"}[dataset.kind]
    values = dataset.inputs
    names = dataset.label_names
    return [
        dspy.Example(**{field: values[i], "label": names[y]}).with_inputs(field)
        for i, y in enumerate(dataset.labels)
    ]


def label_accuracy(example: dspy.Example, prediction: dspy.Prediction, trace: object = None) -> bool:
    """DSPy metric: the predicted label equals the gold label."""
    return str(prediction.label) == str(example.label)
