"""``ONNXTokenizer``: a transformers tokenizer that pads to what the graph accepts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ...errors import MetadataError
from ..graph import GraphInput
from .base import AudioInput, BaseONNXProcessor, ImageInput
from .fast_tokenizer import FastEncoding, FastTokenizer

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedTokenizerBase

__all__ = ["ONNXTokenizer", "TokenizedBatch", "Tokenizer", "load_tokenizer"]

#: A tokenizer the processors call: ours on the ``tokenizers`` library, or transformers' own.
Tokenizer: TypeAlias = "FastTokenizer | PreTrainedTokenizerBase"
#: What a tokenizer call returns: numpy arrays by name, with ``sequence_ids(i)``.
TokenizedBatch: TypeAlias = "FastEncoding | BatchEncoding"

_NO_LIMIT = 1_000_000


def load_tokenizer(folder: Path | None) -> Tokenizer:
    """The tokenizer saved beside the model; MetadataError when there is none.

    A folder with ``tokenizer.json`` gets :class:`FastTokenizer` (no torch or transformers import, the
    same feeds); others, and configs it does not cover, get transformers' ``AutoTokenizer``.
    """
    if folder is None or not any(
        (folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
    ):
        raise MetadataError(
            f"the model needs a tokenizer but {folder or 'its folder'} has no tokenizer files",
            hint="export from a Hugging Face folder that has its tokenizer, or pass data_processor=tokenizer",
        )
    fast = FastTokenizer.from_folder(folder)
    if fast is not None:
        return fast
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MetadataError(f"the tokenizer files in {folder} do not load: {exc}") from exc


class ONNXTokenizer(BaseONNXProcessor):
    """Tokenize a batch: fixed sequence length in the graph -> pad/truncate to it; dynamic -> pad to the longest."""

    kind = "tokenizer"
    modality = "texts"

    def __init__(
        self, tokenizer: Tokenizer, inputs: list[GraphInput], config: dict[str, Any] | None = None
    ) -> None:
        super().__init__(inputs, config)
        self.tokenizer = tokenizer
        ids = self.input("input_ids") or (self.inputs[0] if self.inputs else None)
        self.fixed_length = ids.dim(1) if ids is not None else None
        self.max_length = self.fixed_length or self._max_length()

    def _max_length(self) -> int | None:
        limit = getattr(self.tokenizer, "model_max_length", None)
        if limit and limit < _NO_LIMIT:
            return int(limit)
        positions = self.config.get("max_position_embeddings")
        return int(positions) if positions else None

    def encode(self, texts: list[str], pairs: list[str] | None = None, **kwargs: object) -> TokenizedBatch:
        """A numpy BatchEncoding (offsets, word ids... as asked) padded for this graph."""
        padding = "max_length" if self.fixed_length else True
        args = (texts, pairs) if pairs is not None else (texts,)
        return self.tokenizer(
            *args,
            padding=padding,
            truncation=kwargs.pop("truncation", True if self.max_length else False),
            max_length=self.max_length,
            return_tensors="np",
            **kwargs,
        )

    def feeds(self, encoding: Mapping[str, object]) -> dict[str, np.ndarray]:
        return self.cast({k: v for k, v in encoding.items() if isinstance(v, np.ndarray)})

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        items = self._require(texts, "texts")
        return self.feeds(self.encode([str(t) for t in items], **kwargs))

    @property
    def transformers_classes(self) -> list[str]:
        return [] if isinstance(self.tokenizer, FastTokenizer) else [type(self.tokenizer).__name__]

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "tokenizer_class": type(self.tokenizer).__name__,
            "padding": "max_length" if self.fixed_length else "longest",
            "max_length": self.max_length,
        }
