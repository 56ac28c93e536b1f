"""``ONNXVisionTextProcessor``: images and prompts -> a vision-language package's feeds, through the model's own
transformers processor (its image processor: resizing, patches or crops; its tokenizer; its chat template).

The processor is the package's (its ``processor_config.json``, ``preprocessor_config.json``, tokenizer files and
chat template, copied at export), loaded with :func:`.._transformers.load_processor` (without torchvision, a
video processor is left out). Each prompt gets the chat template's user turn with one image part per image, and
prompts of a batch are padded on the left. An image is checked on its own before anything runs
(:meth:`ONNXVisionTextProcessor.check_images`): an unreadable file, or a size or aspect ratio the image
processor refuses, is an :class:`~modelexport.errors.ImageInputError` naming the image.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._transformers import load_processor
from ...errors import ImageInputError, InferenceError, MetadataError, first_line
from ..graph import GraphInput
from ..multimodal import build_prompt
from .base import AudioInput, BaseONNXProcessor, ImageInput
from .image import to_array

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

__all__ = ["ONNXVisionTextProcessor", "load_rgb"]


def load_rgb(image: ImageInput) -> np.ndarray:
    """An (H, W, 3) uint8 array from a path, PIL image or array; ImageInputError naming what is wrong."""
    label = str(image) if isinstance(image, (str, os.PathLike)) else type(image).__name__
    try:
        arr = to_array(image)
    except InferenceError as exc:
        raise ImageInputError(str(exc), hint=exc.__dict__.get("hint")) from exc
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ImageInputError(f"image {label} is empty ({arr.shape[1]} x {arr.shape[0]} pixels)")
    if arr.dtype != np.uint8:
        arr = np.minimum(
            np.maximum(arr.astype(np.float64) * (255.0 if arr.max() <= 1.0 else 1.0), 0), 255
        ).astype(np.uint8)
    return np.repeat(arr, 3, axis=2) if arr.shape[2] == 1 else arr


class ONNXVisionTextProcessor(BaseONNXProcessor):
    """(images, prompt) pairs -> ``input_ids``, ``attention_mask`` and the processor's vision inputs, as numpy."""

    kind = "image_text_processor"
    modality = "images+texts"

    def __init__(
        self, processor: ProcessorMixin, inputs: list[GraphInput], config: dict[str, Any] | None = None
    ) -> None:
        super().__init__(inputs, config)
        self.processor = processor

    @classmethod
    def from_folder(cls, folder: Path | None, inputs: list[GraphInput]) -> ONNXVisionTextProcessor:
        if folder is None:
            raise MetadataError("an image-text-to-text package needs its processor files beside the graphs")
        try:
            processor = load_processor(folder)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types for missing or broken files
            raise MetadataError(
                f"the processor files in {folder} do not load ({type(exc).__name__}: {first_line(exc)})",
                hint="re-export the model: the package keeps its processor_config.json, preprocessor_config.json, "
                "tokenizer and chat template",
            ) from exc
        return cls(processor, inputs)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.processor.tokenizer

    @property
    def transformers_classes(self) -> list[str]:
        return [type(self.processor).__name__]

    def check_images(self, images: Sequence[ImageInput]) -> list[np.ndarray]:
        """Each image as RGB, after its own run through the image processor: an image it cannot take raises
        :class:`ImageInputError` before any graph runs."""
        loaded = []
        for image in images:
            arr = load_rgb(image)
            try:
                self.processor.image_processor(images=[arr], return_tensors="np")
            except Exception as exc:  # noqa: BLE001 - image processors raise ValueError, TypeError, ...
                label = str(image) if isinstance(image, (str, os.PathLike)) else "an image"
                raise ImageInputError(
                    f"{type(self.processor.image_processor).__name__} cannot take {label} ({arr.shape[1]} x "
                    f"{arr.shape[0]} pixels): {first_line(exc)}"
                ) from exc
            loaded.append(arr)
        return loaded

    def prompts(self, texts: Sequence[str], counts: Sequence[int]) -> list[str]:
        """Each text as the model's prompt about its ``count`` images (the chat template's user turn)."""
        return [build_prompt(self.processor, str(t), n) for t, n in zip(texts, counts, strict=True)]

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput | Sequence[ImageInput]] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        """Feeds for prompts ``texts`` about ``images`` (one list of images per prompt, or one image each)."""
        texts = self._require(texts, "texts")
        per_prompt = [
            list(i) if isinstance(i, (list, tuple)) else [i] for i in self._require(images, "images")
        ]
        if len(per_prompt) != len(texts):
            raise InferenceError(
                f"{len(texts)} prompt(s) but {len(per_prompt)} image list(s): give one per prompt"
            )
        arrays = [self.check_images(group) for group in per_prompt]
        tok = self.tokenizer
        side, pad = tok.padding_side, tok.pad_token
        tok.padding_side = "left"  # generation appends on the right
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        try:
            with (
                warnings.catch_warnings()
            ):  # transformers warns that padding=True ignores a max_length never given
                warnings.filterwarnings("ignore", message=".*max_length.*is ignored", category=UserWarning)
                out = self.processor(
                    text=self.prompts(texts, [len(a) for a in arrays]),
                    images=arrays,
                    padding=True,
                    return_tensors="np",
                )
        except ImageInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the processor's own errors, re-raised typed
            raise InferenceError(
                f"{type(self.processor).__name__} failed on {len(texts)} prompt(s): {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            tok.padding_side, tok.pad_token = side, pad
        return {k: np.asarray(v) for k, v in out.items()}

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "processor": type(self.processor).__name__,
            "image_processor": type(self.processor.image_processor).__name__,
            "chat_template": bool(getattr(self.processor, "chat_template", None)),
        }
