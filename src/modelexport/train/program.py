"""The classifier as a DSPy program: ``forward(text=...)`` / ``forward(image=...)`` -> ``dspy.Prediction``.

The same program object is trained (torch backend), then deployed (ONNX Runtime backend, optionally
through a test-time policy engine), so DSPy evaluation, tools and agents use it unchanged throughout.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dspy
import numpy as np

from ..data import Dataset
from ..errors import InferenceError
from .networks import Network

__all__ = [
    "ClassifierProgram",
    "TorchBackend",
    "OnnxBackend",
    "to_examples",
    "label_accuracy",
    "softmax",
]

Backend = Callable[[dict[str, np.ndarray]], np.ndarray]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class TorchBackend:
    """Logits from the torch network in eval mode (training and validation)."""

    name = "torch"

    def __init__(self, network: Network) -> None:
        self.network = network

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        was_training = self.network.module.training
        self.network.module.eval()
        try:
            with torch.no_grad():
                return self.network.logits(feeds).detach().cpu().numpy()
        finally:
            self.network.module.train(was_training)


class OnnxBackend:
    """Logits from an ONNX Runtime session (what is deployed); provider fallback via ``create_session``."""

    name = "onnxruntime"

    def __init__(self, model_path: str | Path, providers: Sequence[str] | None = None) -> None:
        from ..runtime.session import create_session

        self.model_path = Path(model_path)
        self.session, self.info = create_session(self.model_path, providers=tuple(providers or ()))
        self.input_names = [i.name for i in self.session.get_inputs()]

    @property
    def provider(self) -> str:
        return self.info.provider

    def __call__(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InferenceError(f"{self.model_path.name} needs inputs {missing}; the encoder gave {sorted(feeds)}")
        return self.session.run(None, {n: feeds[n] for n in self.input_names})[0]


def _key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.shape, str(value.dtype), hashlib.blake2b(value.tobytes(), digest_size=16).digest())
    return value


class ClassifierProgram(dspy.Module):
    """A classifier with DSPy's interface; ``backend`` is the torch network or a deployed ONNX model."""

    def __init__(self, network: Network, batch_size: int = 64) -> None:
        super().__init__()
        self.network = network
        self.batch_size = batch_size
        self.label_names = [network.id2label[i] for i in range(len(network.id2label))]
        self.label2id = {name: i for i, name in enumerate(self.label_names)}
        self.backend: Backend = TorchBackend(network)
        self._cache: dict[Any, dspy.Prediction] = {}

    @property
    def input_field(self) -> str:
        return self.network.input_field

    def forward(self, **inputs: Any) -> dspy.Prediction:
        """Classify one input given as ``text=...`` or ``image=...``."""
        if self.input_field not in inputs:
            raise InferenceError(f"this program classifies {self.input_field} inputs; got {sorted(inputs)}")
        value = inputs[self.input_field]
        cached = self._cache.get(_key(value))
        return cached if cached is not None else self.predict_batch([value])[0]

    def probabilities(self, inputs: Sequence[Any], batch_size: int | None = None) -> np.ndarray:
        """Class probabilities ``(N, K)`` in batches through the current backend."""
        size = batch_size or self.batch_size
        parts = [softmax(self.backend(self.network.encode(inputs[i : i + size]))) for i in range(0, len(inputs), size)]
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

    def deploy(self, model_path: str | Path, providers: Sequence[str] | None = None) -> ClassifierProgram:
        """Serve predictions from the exported ONNX model from now on."""
        self.backend = OnnxBackend(model_path, providers)
        return self

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
    return [dspy.Example(**{field: values[i], "label": names[y]}).with_inputs(field) for i, y in enumerate(dataset.labels)]


def label_accuracy(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> bool:
    """DSPy metric: the predicted label equals the gold label."""
    return str(prediction.label) == str(example.label)
