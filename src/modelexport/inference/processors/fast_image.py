"""``FastImageProcessor``: transformers' common image processors in numpy + PIL, without transformers.

Serving an image model should not import torch or transformers (seconds of start-up) for arithmetic
this small: resize (PIL, as transformers' slow processors do), center crop, rescale, normalise. The
classes covered are those whose ``preprocess`` is exactly that sequence; each registers its resize rule
under its ``image_processor_type``. Anything else (another class, a float image, an option not covered)
goes to transformers' own class, built on first use, so output never silently differs; tests compare
every covered class with transformers on images of several sizes and modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from transformers import BaseImageProcessor

__all__ = ["FAST_IMAGE_RULES", "FastImageProcessor"]

#: ``preprocess`` options this class implements; a call with another option goes to transformers.
_CALL_KEYS = {"images", "return_tensors", "input_data_format", "data_format"}
#: Config settings that change the arithmetic and are not implemented here (covered only when off).
_UNCOVERED_FLAGS = ("do_pad", "do_reduce_labels", "do_flip_channel_order")

Size = tuple[int, int]


def _shortest_edge(hw: Size, edge: int) -> Size:
    """transformers' ``get_resize_output_image_size(..., default_to_square=False)``."""
    h, w = hw
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = edge, int(edge * long / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def _height_width(hw: Size, size: dict[str, Any], cfg: dict[str, Any]) -> tuple[Size, Size | None]:
    if set(size) != {"height", "width"}:
        raise ValueError(f"size must have height and width, got {sorted(size)}")
    return (int(size["height"]), int(size["width"])), None


def _shortest_edge_rule(hw: Size, size: dict[str, Any], cfg: dict[str, Any]) -> tuple[Size, Size | None]:
    if "shortest_edge" in size:
        return _shortest_edge(hw, int(size["shortest_edge"])), None
    return _height_width(hw, size, cfg)


def _crop_pct_rule(hw: Size, size: dict[str, Any], cfg: dict[str, Any]) -> tuple[Size, Size | None]:
    """ConvNeXt: under 384 px, resize the shortest edge to ``edge / crop_pct``, then crop ``edge``^2."""
    if set(size) != {"shortest_edge"}:
        raise ValueError(f"size must have shortest_edge, got {sorted(size)}")
    edge = int(size["shortest_edge"])
    if edge >= 384:
        return (edge, edge), None
    return _shortest_edge(hw, int(edge / float(cfg.get("crop_pct") or 224 / 256))), (edge, edge)


Rule = Callable[[Size, dict[str, Any], dict[str, Any]], tuple[Size, Size | None]]
#: Settings every covered config must spell out (class defaults differ: resample is bilinear for ViT,
#: bicubic for CLIP); transformers writes them all in ``preprocessor_config.json``.
_REQUIRED = (
    "do_resize",
    "size",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
)
_CROP = ("do_center_crop", "crop_size")
#: ``image_processor_type`` -> (its resize rule: image HxW -> resize HxW and the crop it forces, the
#: settings it needs beyond ``_REQUIRED``).
FAST_IMAGE_RULES: dict[str, tuple[Rule, tuple[str, ...]]] = {
    "ViTImageProcessor": (_height_width, ()),
    "DeiTImageProcessor": (_height_width, _CROP),
    "BeitImageProcessor": (_height_width, _CROP),
    "CLIPImageProcessor": (_shortest_edge_rule, _CROP),
    "BitImageProcessor": (_shortest_edge_rule, _CROP),
    "ConvNextImageProcessor": (_crop_pct_rule, ("crop_pct",)),
}


def _center_crop(image: np.ndarray, crop: Size) -> np.ndarray | None:
    """transformers' center crop (HWC); None where it would pad (left to transformers)."""
    h, w = image.shape[:2]
    top, left = (h - crop[0]) // 2, (w - crop[1]) // 2
    if top < 0 or left < 0:
        return None
    return image[top : top + crop[0], left : left + crop[1]]


class FastImageProcessor:
    """A covered transformers image processor config, applied with numpy + PIL (same outputs)."""

    def __init__(
        self, config: dict[str, Any], fallback: Callable[[dict[str, Any]], BaseImageProcessor]
    ) -> None:
        self.config = dict(config)
        self._rule, extra = FAST_IMAGE_RULES[self.config["image_processor_type"]]
        missing = [k for k in (*_REQUIRED, *extra) if k not in self.config]
        if missing:
            raise KeyError(f"the config does not set {missing}")
        self._fallback = fallback
        self._slow: BaseImageProcessor | None = None
        self._rule(
            (37, 53), dict(self.config.get("size") or {}), self.config
        )  # a size it cannot do: ValueError

    @classmethod
    def from_config(
        cls, config: dict[str, Any], fallback: Callable[[dict[str, Any]], BaseImageProcessor]
    ) -> FastImageProcessor | None:
        """The fast processor for ``config``, or None where transformers' class must do it."""
        if config.get("image_processor_type") not in FAST_IMAGE_RULES or any(
            config.get(flag) for flag in _UNCOVERED_FLAGS
        ):
            return None
        try:
            return cls(config, fallback)
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def class_name(self) -> str:
        """The transformers class this config is for (what ``describe()`` reports)."""
        return str(self.config["image_processor_type"])

    # the two methods the image input adapter uses to set a processor to a graph's fixed size
    def to_dict(self) -> dict[str, Any]:
        return dict(self.config)

    def from_dict(self, config: dict[str, Any]) -> FastImageProcessor:
        return type(self)(config, self._fallback)

    @property
    def slow(self) -> BaseImageProcessor:
        """transformers' own class for this config (imports transformers: only for what is not covered)."""
        if self._slow is None:
            self._slow = self._fallback(self.config)
        return self._slow

    def _one(self, image: np.ndarray) -> np.ndarray | None:
        from PIL import Image

        cfg = self.config
        if cfg.get("do_resize", True):
            (h, w), crop = self._rule(image.shape[:2], dict(cfg.get("size") or {}), cfg)
            pil = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image)
            image = np.asarray(pil.resize((w, h), resample=int(cfg.get("resample", 2))))
            image = image[:, :, None] if image.ndim == 2 else image
        else:
            crop = None
        if crop is None and cfg.get("do_center_crop"):
            size = cfg.get("crop_size") or {}
            crop = (int(size["height"]), int(size["width"]))
        if crop is not None and (image := _center_crop(image, crop)) is None:
            return None
        out = image.astype(np.float32)
        if cfg.get("do_rescale", True):
            out = (image.astype(np.float64) * float(cfg.get("rescale_factor", 1 / 255))).astype(np.float32)
        if cfg.get("do_normalize", True):
            channels = out.shape[2]
            mean = np.broadcast_to(np.asarray(cfg.get("image_mean", 0.5), np.float32), (channels,))
            std = np.broadcast_to(np.asarray(cfg.get("image_std", 0.5), np.float32), (channels,))
            out = (out - mean) / std
        return out

    def __call__(self, images: list[np.ndarray], **kwargs: object) -> dict[str, list[np.ndarray]]:
        """transformers' ``preprocess(images, return_tensors=None, ...)`` for HWC uint8 arrays."""
        covered = (
            set(kwargs) <= _CALL_KEYS and kwargs.get("input_data_format", "channels_last") == "channels_last"
        )
        last = kwargs.pop("data_format", "channels_first") == "channels_last"
        if covered and all(isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.ndim == 3 for a in images):
            done = [self._one(a) for a in images]
            if all(d is not None for d in done):
                return {"pixel_values": [d if last else d.transpose(2, 0, 1) for d in done]}
        out = dict(self.slow(images=images, **kwargs))  # channels first (transformers 5 has no data_format)
        if last:
            out["pixel_values"] = [np.moveaxis(np.asarray(a), 0, -1) for a in out["pixel_values"]]
        return out
