"""Common ground of the ONNX processors: the graph's inputs and the step from arrays to session feeds."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ...errors import InferenceError
from ..graph import GraphInput

if TYPE_CHECKING:
    import numpy.typing as npt
    from PIL.Image import Image as PILImage

__all__ = ["AudioInput", "BaseONNXProcessor", "ImageInput"]

#: One image: a PIL image, a file path or an (H, W[, C]) array.
ImageInput: TypeAlias = "PILImage | str | os.PathLike[str] | npt.ArrayLike"
#: One waveform: a 1-D (or (1, N)) array or a PCM .wav path.
AudioInput: TypeAlias = "str | os.PathLike[str] | npt.ArrayLike"


class BaseONNXProcessor:
    """Turns raw inputs into a ``dict[str, np.ndarray]`` that a session of this graph accepts."""

    kind = "processor"
    #: The argument of ``__call__`` this processor consumes (texts, images, audio).
    modality = ""

    def __init__(self, inputs: list[GraphInput], config: dict[str, Any] | None = None) -> None:
        self.inputs = list(inputs)
        self.config = dict(config or {})

    @property
    def transformers_classes(self) -> list[str]:
        """transformers classes that do this processor's work (empty: our own code does, the same under
        every transformers version)."""
        return []

    def input(self, name: str) -> GraphInput | None:
        return next((i for i in self.inputs if i.name == name), None)

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the graph was fixed to, if any."""
        dims = [i.dim(0) for i in self.inputs if i.shape]
        return next((d for d in dims if d), None)

    def cast(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Keep the graph's inputs only, in its dtypes; fill a missing token_type_ids with zeros."""
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            value = feeds.get(spec.name)
            if value is None and spec.name == "token_type_ids" and "input_ids" in feeds:
                value = np.zeros_like(feeds["input_ids"])
            if value is None:
                raise InferenceError(
                    f"the {self.kind} produced no value for graph input {spec.name!r} (it produced {sorted(feeds)})"
                )
            out[spec.name] = np.ascontiguousarray(np.asarray(value).astype(spec.np_dtype, copy=False))
        return out

    def describe(self) -> dict[str, Any]:
        """What was detected: class, graph inputs, and the settings that shape the feeds."""
        return {"class": type(self).__name__, "inputs": [i.to_dict() for i in self.inputs]}

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        """Feeds for one batch of the modality this processor reads (one input or a list); ``kwargs`` are
        options of the underlying transformers call (the tokenizer's), ignored by the others."""
        raise NotImplementedError

    def _require(self, value: object, what: str) -> list[Any]:
        if value is None:
            raise InferenceError(f"{type(self).__name__} needs {what}=[...]")
        return list(value) if isinstance(value, (list, tuple)) else [value]
