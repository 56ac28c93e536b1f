"""``ONNXImageProcessor``: PIL images, paths or arrays -> the graph's image input, by transformers.

The pre-processing itself (resize, crop, rescale, normalise) is transformers' slow image processor, built
from the model's ``preprocessor_config.json`` or its embedded config: for the common classes in numpy +
PIL (:class:`.fast_image.FastImageProcessor`, same outputs, no torch or transformers import), else
transformers' own class. Only what the graph fixes is adapted: a fixed H x W overrides the size/crop
settings when they would give another size, a 1-channel graph gets grayscale and a 3-channel graph RGB, a
channels-last graph gets NHWC, and a dynamic H x W batch of different sizes is zero-padded to the largest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ..._numeric import check_fits_in_memory, tensor_bytes
from ...errors import InferenceError, MetadataError
from ...metadata.build import hf_processor
from ..graph import GraphInput
from .base import AudioInput, BaseONNXProcessor, ImageInput
from .fast_image import FastImageProcessor

if TYPE_CHECKING:
    from transformers import BaseImageProcessor

__all__ = ["ImageProcessor", "ONNXImageProcessor", "to_array"]

#: What pre-processes the images: ours in numpy + PIL, or transformers' own class.
ImageProcessor: TypeAlias = "FastImageProcessor | BaseImageProcessor"

log = logging.getLogger(__name__)

_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float64)  # ITU-R 601-2, as PIL's convert("L")


def to_array(image: ImageInput) -> np.ndarray:
    """An HWC array (uint8 or float) from a PIL image, a file path or an (H, W) / (H, W, C) array."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise InferenceError(f"image file not found: {path}")
        try:
            with Image.open(path) as img:
                image = img.convert("RGB") if img.mode not in ("L", "RGB") else img.copy()
        except Image.DecompressionBombError as exc:  # Pillow's guard: the header declares too many pixels
            raise InferenceError(
                f"{path} declares more pixels than Pillow's limit of {Image.MAX_IMAGE_PIXELS:,} ({exc})",
                hint="a decompression bomb, or an image far larger than any model input: resize it first",
            ) from exc
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:  # truncated or broken files
            raise InferenceError(
                f"{path} is not an image Pillow can read ({exc})",
                hint="give a PNG, JPEG, BMP, GIF, TIFF or WebP file (or an array)",
            ) from exc
    if isinstance(image, Image.Image):
        image = image.convert("RGB") if image.mode not in ("L", "RGB") else image
        image = np.asarray(image)
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise InferenceError(f"images must be (H, W) or (H, W, C) with C in 1, 3, 4; got shape {arr.shape}")
    return arr[:, :, :3] if arr.shape[2] == 4 else arr


def _channels(arr: np.ndarray, channels: int) -> np.ndarray:
    if arr.shape[2] == channels:
        return arr
    if channels == 1:
        gray = arr.astype(np.float64) @ _GRAY
        return (np.round(gray).astype(np.uint8) if arr.dtype == np.uint8 else gray.astype(np.float32))[
            :, :, None
        ]
    if arr.shape[2] == 1:
        return np.repeat(arr, channels, axis=2)
    raise InferenceError(f"cannot turn a {arr.shape[2]}-channel image into {channels} channels")


#: An odd, non-square image: a config whose output size depends on the input's shows it on this one.
_PROBE_HW = (37, 53)


def _graph_fits(proc: ImageProcessor, height: int, width: int) -> list[dict[str, Any]]:
    """Settings that make ``proc`` give ``height x width``, most faithful first: keep the center crop
    (shortest edge + crop), a square shortest edge (crop_pct configs crop to it), else resize to it."""
    fits: list[dict[str, Any]] = []
    if proc.to_dict().get("do_center_crop"):
        crop = {"height": height, "width": width}
        fits.append({"do_resize": True, "size": {"shortest_edge": min(height, width)}, "crop_size": crop})
    if height == width:
        fits.append({"do_resize": True, "size": {"shortest_edge": height}})
    fits.append({"do_resize": True, "size": {"height": height, "width": width}, "do_center_crop": False})
    return fits


class ONNXImageProcessor(BaseONNXProcessor):
    """Images -> ``pixel_values`` (NCHW, or NHWC when the graph is channels-last) for this graph."""

    kind = "image_processor"
    modality = "images"

    def __init__(
        self,
        inputs: list[GraphInput],
        config: dict[str, Any] | None = None,
        input_name: str | None = None,
        *,
        processor: ImageProcessor | None = None,
        model_type: str | None = None,
    ) -> None:
        super().__init__(inputs, processor.to_dict() if processor is not None else config)
        main = self.input(input_name or "pixel_values") or next(
            (i for i in self.inputs if len(i.shape) == 4), None
        )
        if main is None:
            raise InferenceError(f"no 4-D image input among the graph inputs {[i.name for i in self.inputs]}")
        self.main = main
        dims = main.shape
        self.channels_last = dims[3] in (1, 3, 4) and dims[1] not in (1, 3, 4)
        c_axis, h_axis, w_axis = (3, 1, 2) if self.channels_last else (1, 2, 3)
        self.channels = dims[c_axis] or int(
            self.config.get("num_channels") or len(self.config.get("image_mean") or [0, 0, 0])
        )
        self.fixed_hw = (dims[h_axis], dims[w_axis]) if dims[h_axis] and dims[w_axis] else None
        if self.fixed_hw:  # the graph's fixed size is what every image is resized to: refuse what cannot fit
            check_fits_in_memory(
                tensor_bytes((*self.fixed_hw, self.channels), 4), f"one {self.fixed_hw} image", InferenceError
            )
        if processor is None:  # numpy + PIL where the config is covered, else transformers' own class

            def slow(config: dict[str, Any]) -> BaseImageProcessor:
                return hf_processor(config, self.kind, model_type)

            processor = FastImageProcessor.from_config(self.config, slow) or slow(self.config)
        self.processor = self._fit(processor)

    def _run(self, proc: ImageProcessor, arrays: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
        """``proc`` on HWC arrays; pixel values channels first, as every transformers version writes them
        (5.x dropped ``data_format``), turned channels last here for a channels-last graph."""
        out = proc(images=arrays, return_tensors=None, input_data_format="channels_last")
        done = {k: [np.asarray(a) for a in v] for k, v in out.items()}
        if self.channels_last:
            done["pixel_values"] = [np.moveaxis(a, 0, -1) for a in done["pixel_values"]]
        return done

    def _hw(self, pixels: np.ndarray) -> tuple[int, int]:
        return pixels.shape[:2] if self.channels_last else pixels.shape[1:3]

    def _fit(self, proc: ImageProcessor) -> ImageProcessor:
        """``proc`` itself when it gives the graph's fixed H x W, else a copy set to give it."""
        if self.fixed_hw is None:
            return proc
        probe = [np.zeros((*_PROBE_HW, self.channels), dtype=np.uint8)]
        if self._hw(self._run(proc, probe)["pixel_values"][0]) == self.fixed_hw:
            return proc
        for changes in _graph_fits(proc, *self.fixed_hw):
            try:
                fitted = proc.from_dict({**proc.to_dict(), **changes})
                if self._hw(self._run(fitted, probe)["pixel_values"][0]) == self.fixed_hw:
                    log.info("image processor set to the graph's fixed size %s: %s", self.fixed_hw, changes)
                    return fitted
            except (ValueError, KeyError, TypeError):
                continue
        raise MetadataError(
            f"{type(proc).__name__} cannot be set to the graph's fixed size {self.fixed_hw}",
            hint="export with a dynamic image size or pass a matching data_processor",
        )

    def _pad(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Stack; a dynamic H x W batch of different sizes is zero-padded (bottom, right) to the largest."""
        h_axis, w_axis = (0, 1) if self.channels_last else (1, 2)
        h = max(a.shape[h_axis] for a in arrays)
        w = max(a.shape[w_axis] for a in arrays)
        padded = []
        for a in arrays:
            pad = [(0, 0)] * a.ndim
            pad[h_axis], pad[w_axis] = (0, h - a.shape[h_axis]), (0, w - a.shape[w_axis])
            padded.append(np.pad(a, pad))
        return np.stack(padded)

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        arrays = [_channels(to_array(img), self.channels) for img in self._require(images, "images")]
        out = self._run(self.processor, arrays)
        feeds = {k: np.stack(v) for k, v in out.items() if k != "pixel_values" and self.input(k)}
        feeds[self.main.name] = self._pad(out["pixel_values"])
        return self.cast(feeds)

    @property
    def transformers_classes(self) -> list[str]:
        return [] if isinstance(self.processor, FastImageProcessor) else [type(self.processor).__name__]

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "transformers_class": getattr(self.processor, "class_name", type(self.processor).__name__),
            "numpy_pipeline": isinstance(self.processor, FastImageProcessor),
            "channels": self.channels,
            "fixed_hw": self.fixed_hw,
            "channels_last": self.channels_last,
        }
