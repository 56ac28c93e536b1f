"""``ONNXImageProcessor``: PIL images, paths or arrays -> the graph's channels and H x W, normalised.

Follows transformers' image-processor config (``size``, ``resample``, ``do_center_crop``/``crop_size``,
``rescale_factor``, ``image_mean``/``image_std``) and the graph: a fixed H x W wins over the config,
a 1-channel graph gets grayscale, a 3-channel graph gets RGB.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InferenceError
from ..graph import GraphInput
from .base import BaseONNXProcessor

__all__ = ["ONNXImageProcessor", "to_array"]

_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float64)  # ITU-R 601-2, as PIL's convert("L")


def to_array(image: Any) -> np.ndarray:
    """An HWC array (uint8 or float) from a PIL image, a file path or an (H, W) / (H, W, C) array."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise InferenceError(f"image file not found: {path}")
        try:
            with Image.open(path) as img:
                image = img.convert("RGB") if img.mode not in ("L", "RGB") else img.copy()
        except UnidentifiedImageError as exc:
            raise InferenceError(f"{path} is not an image Pillow can read") from exc
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


def _resize(arr: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    from PIL import Image

    if arr.shape[:2] == (height, width):
        return arr
    if arr.dtype == np.uint8:
        img = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        out = np.asarray(img.resize((width, height), resample=resample))
        return out[:, :, None] if out.ndim == 2 else out
    planes = [
        np.asarray(
            Image.fromarray(arr[:, :, c].astype(np.float32), mode="F").resize(
                (width, height), resample=resample
            )
        )
        for c in range(arr.shape[2])
    ]
    return np.stack(planes, axis=2)


def _center_crop(arr: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = arr.shape[:2]
    if h < height or w < width:  # pad like transformers does before cropping
        pad = (
            (max(0, (height - h + 1) // 2), max(0, (height - h) // 2)),
            (max(0, (width - w + 1) // 2), max(0, (width - w) // 2)),
            (0, 0),
        )
        arr, (h, w) = np.pad(arr, pad), (max(h, height), max(w, width))
    top, left = (h - height) // 2, (w - width) // 2
    return arr[top : top + height, left : left + width]


def _hw(size: Any) -> tuple[int | None, int | None, int | None]:
    """(height, width, shortest_edge) from transformers' size forms."""
    if isinstance(size, int):
        return size, size, None
    if isinstance(size, dict):
        if "height" in size and "width" in size:
            return int(size["height"]), int(size["width"]), None
        if "shortest_edge" in size:
            return None, None, int(size["shortest_edge"])
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1]), None
    return None, None, None


class ONNXImageProcessor(BaseONNXProcessor):
    """Images -> ``pixel_values`` (NCHW, or NHWC when the graph is channels-last) for this graph."""

    kind = "image_processor"
    modality = "images"

    def __init__(
        self, inputs: list[GraphInput], config: dict[str, Any] | None = None, input_name: str | None = None
    ) -> None:
        super().__init__(inputs, config)
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

    def _target(self, arr: np.ndarray) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """(resize to, crop to) for one image."""
        cfg = self.config
        crop = _hw(cfg.get("crop_size"))[:2] if cfg.get("do_center_crop") else (None, None)
        crop_hw = (crop[0], crop[1]) if crop[0] else None
        if self.fixed_hw and crop_hw and crop_hw != self.fixed_hw:
            crop_hw = None
        height, width, shortest = _hw(cfg.get("size"))
        if cfg.get("do_resize", True) is False and not self.fixed_hw:
            return None, crop_hw
        if shortest:
            pct = cfg.get("crop_pct")
            edge = int(shortest / pct) if pct and shortest < 384 else shortest
            h, w = arr.shape[:2]
            scale = edge / min(h, w)
            resize = (max(1, int(h * scale)), max(1, int(w * scale)))
            crop_hw = crop_hw or ((shortest, shortest) if pct and shortest < 384 else None)
            if self.fixed_hw and (crop_hw or resize) != self.fixed_hw:
                return self.fixed_hw, None
            return resize, crop_hw
        if height and width and (not self.fixed_hw or crop_hw or (height, width) == self.fixed_hw):
            return (height, width), crop_hw
        return self.fixed_hw, None

    def _one(self, image: Any) -> np.ndarray:
        arr = _channels(to_array(image), self.channels)
        resize, crop = self._target(arr)
        if resize:
            arr = _resize(arr, resize[0], resize[1], int(self.config.get("resample", 2)))
        if crop:
            arr = _center_crop(arr, *crop)
        x = arr.astype(np.float32)
        if self.config.get("do_rescale", True) and (arr.dtype == np.uint8 or float(x.max(initial=0)) > 1.0):
            x = (arr.astype(np.float64) * float(self.config.get("rescale_factor", 1 / 255))).astype(
                np.float32
            )
        if self.config.get("do_normalize", "image_mean" in self.config):
            x = (x - self._stat("image_mean", 0.0)) / self._stat("image_std", 1.0)
        return x

    def _stat(self, key: str, default: float) -> np.ndarray:
        values = self.config.get(key, default)
        values = np.atleast_1d(np.asarray(values, dtype=np.float32))
        if len(values) != self.channels:
            values = np.full(self.channels, float(values.mean()), dtype=np.float32)
        return values

    def __call__(
        self, texts: Any = None, images: Any = None, audio: Any = None, **kwargs: Any
    ) -> dict[str, np.ndarray]:
        arrays = [self._one(img) for img in self._require(images, "images")]
        h = max(a.shape[0] for a in arrays)
        w = max(a.shape[1] for a in arrays)  # dynamic H x W: natural sizes, zero-padded per batch
        batch = np.stack([np.pad(a, ((0, h - a.shape[0]), (0, w - a.shape[1]), (0, 0))) for a in arrays])
        pixels = batch if self.channels_last else batch.transpose(0, 3, 1, 2)
        return self.cast({self.main.name: pixels})

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "channels": self.channels,
            "fixed_hw": self.fixed_hw,
            "channels_last": self.channels_last,
        }
