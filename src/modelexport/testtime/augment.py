"""Test-time augmentation transforms, per modality, in one registry.

A transform turns a batch into one or more *views* of the same batch (five_crop gives five). Image batches
are NCHW float arrays, text batches are lists of strings (augmented before tokenization), tensor batches
are (N, ...) float arrays. Invertible transforms also carry ``invert(y, view)``, which maps a dense output
of that view (masks, NCHW maps with the input's H and W) back to the original frame before merging.
Random transforms draw from the ``numpy.random.Generator`` they are given, so a seed reproduces them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._config import unknown_choice
from .._registry import Registry
from ..errors import TestTimeError

__all__ = [
    "MODALITIES",
    "TRANSFORMS",
    "Transform",
    "get_transform",
    "make_views",
    "register_transform",
    "resize_bilinear",
    "resolve_transform",
    "transform_names",
    "TRANSFORM_ALIASES",
    "transforms_for",
]

MODALITIES = ("image", "text", "tensor")

ViewFn = Callable[[Any, np.random.Generator], list[Any]]
InvertFn = Callable[[np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class Transform:
    """One TTA transform: its views, and how to undo it on a dense output (None: not invertible)."""

    name: str
    modality: str
    views: ViewFn
    invert: InvertFn | None = None
    random: bool = False

    @property
    def invertible(self) -> bool:
        return self.invert is not None


#: "modality:name" -> Transform.
TRANSFORMS: Registry[Transform] = Registry(
    "TTA transform", error=TestTimeError, hint="choose the TTA transform from the list"
)


def register_transform(
    name: str, modality: str, *, invert: InvertFn | None = None, random: bool = False
) -> Callable[[ViewFn], ViewFn]:
    """Decorator joining a view function to the registry under ``modality:name``."""
    if modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")

    return TRANSFORMS.register_as(
        f"{modality}:{name}", lambda fn: Transform(name, modality, fn, invert, random)
    )


def transforms_for(modality: str) -> list[str]:
    """Names of the transforms a modality offers."""
    return [key.split(":", 1)[1] for key in TRANSFORMS if key.startswith(f"{modality}:")]


#: Other names of registered transforms, per modality: the words a specification uses ("flip", "rotate")
#: for the transform they mean. A policy stores the registered name.
TRANSFORM_ALIASES: dict[str, dict[str, str]] = {"image": {"flip": "hflip", "rotate": "rot90"}}


def resolve_transform(name: str, modality: str) -> str | None:
    """The registered name ``name`` means for ``modality`` (itself, or what its alias stands for); None when
    the modality has no such transform."""
    name = TRANSFORM_ALIASES.get(modality, {}).get(name, name)
    return name if f"{modality}:{name}" in TRANSFORMS else None


def transform_names(modality: str) -> str:
    """The modality's transforms for a message, each alias beside its transform: ``hflip (flip), ...``."""
    aliases: dict[str, list[str]] = {}
    for alias, name in TRANSFORM_ALIASES.get(modality, {}).items():
        aliases.setdefault(name, []).append(alias)
    return ", ".join(
        f"{n} ({', '.join(aliases[n])})" if n in aliases else n for n in transforms_for(modality)
    )


def get_transform(name: str, modality: str) -> Transform:
    name = resolve_transform(name, modality) or name
    key = f"{modality}:{name}"
    if key not in TRANSFORMS:
        raise TestTimeError(
            unknown_choice(f"{modality} TTA transform", name, transforms_for(modality)),
            hint="pass --tta-transforms with names from the list",
        )
    return TRANSFORMS.get(key)


def make_views(
    batch: np.ndarray | list[str], names: tuple[str, ...] | list[str], modality: str, seed: int = 0
) -> tuple[list[Any], list[Transform], list[int]]:
    """All views of ``batch``: (views, the transform of each view, the view index within its transform)."""
    rng = np.random.default_rng(seed)
    views: list[Any] = []
    owners: list[Transform] = []
    index: list[int] = []
    for name in names:
        t = get_transform(name, modality)
        produced = t.views(batch, rng)
        views.extend(produced)
        owners.extend([t] * len(produced))
        index.extend(range(len(produced)))
    return views, owners, index


# ----------------------------------------------------------------------------------------------- image (NCHW)


def _square(x: np.ndarray, name: str) -> None:
    if x.shape[-1] != x.shape[-2]:
        raise TestTimeError(
            f"image TTA {name!r} needs square images, got H x W = {x.shape[-2]} x {x.shape[-1]}"
        )


def resize_bilinear(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of the last two axes (align_corners=False, like torch's interpolate)."""
    h, w = x.shape[-2:]
    if (h, w) == (height, width):
        return x.copy()

    def coords(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (pos - lo).astype(x.dtype)

    y0, y1, fy = coords(height, h)
    x0, x1, fx = coords(width, w)
    rows = x[..., y0, :] * (1 - fy)[:, None] + x[..., y1, :] * fy[:, None]
    return rows[..., x0] * (1 - fx) + rows[..., x1] * fx


def _crop_resize(x: np.ndarray, top: int, left: int, size_h: int, size_w: int) -> np.ndarray:
    h, w = x.shape[-2:]
    return resize_bilinear(x[..., top : top + size_h, left : left + size_w], h, w)


def _five_crops(x: np.ndarray, frac: float = 0.875) -> list[np.ndarray]:
    h, w = x.shape[-2:]
    ch, cw = max(1, round(h * frac)), max(1, round(w * frac))
    corners = [(0, 0), (0, w - cw), (h - ch, 0), (h - ch, w - cw), ((h - ch) // 2, (w - cw) // 2)]
    return [_crop_resize(x, t, left, ch, cw) for t, left in corners]


@register_transform("identity", "image", invert=lambda y, i: y)
def _img_identity(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    return [x]


@register_transform("hflip", "image", invert=lambda y, i: y[..., ::-1].copy())
def _hflip(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    return [x[..., ::-1].copy()]


@register_transform("vflip", "image", invert=lambda y, i: y[..., ::-1, :].copy())
def _vflip(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    return [x[..., ::-1, :].copy()]


def _rot(k: int) -> tuple[ViewFn, InvertFn]:
    def views(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        if k % 2:
            _square(x, f"rot{90 * k}")
        return [np.rot90(x, k, axes=(-2, -1)).copy()]

    return views, lambda y, i: np.rot90(y, -k, axes=(-2, -1)).copy()


for _k in (1, 2, 3):
    _views, _inv = _rot(_k)
    register_transform(f"rot{90 * _k}", "image", invert=_inv)(_views)


@register_transform("five_crop", "image")
def _five_crop(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    return _five_crops(x)


@register_transform("ten_crop", "image")
def _ten_crop(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    crops = _five_crops(x)
    return crops + [c[..., ::-1].copy() for c in crops]


@register_transform("scale", "image")
def _scale(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Zoom in by 10%: centre crop of 1/1.1 of each side, resized back."""
    return [_five_crops(x, 1 / 1.1)[4]]


def _range(x: np.ndarray) -> np.ndarray:
    axes = tuple(range(1, x.ndim))
    return (x.max(axis=axes, keepdims=True) - x.min(axis=axes, keepdims=True)).astype(x.dtype)


@register_transform("brightness", "image")
def _brightness(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Shift by +/-10% of each image's value range (works on normalized inputs too)."""
    delta = np.float32(0.1) * _range(x)
    return [x + delta, x - delta]


@register_transform("contrast", "image")
def _contrast(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Scale around each image's mean by 1.2 and 0.8."""
    mean = x.mean(axis=tuple(range(1, x.ndim)), keepdims=True)
    return [(x - mean) * np.float32(f) + mean for f in (1.2, 0.8)]


# ------------------------------------------------------------------------------------------- tensor (N, ...)


@register_transform("identity", "tensor", invert=lambda y, i: y)
def _tensor_identity(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    return [x]


@register_transform("gaussian_noise", "tensor", random=True)
def _gaussian_noise(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Add noise with 5% of each feature's batch standard deviation."""
    scale = 0.05 * (x.std(axis=0, keepdims=True) + 1e-8)
    return [(x + rng.standard_normal(x.shape) * scale).astype(x.dtype)]


@register_transform("feature_dropout", "tensor", random=True)
def _feature_dropout(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Zero 10% of the features (no rescaling: the model saw unscaled features in training)."""
    return [(x * (rng.random(x.shape) >= 0.1)).astype(x.dtype)]


# -------------------------------------------------------------------------------------------- text (list[str])


def _words(texts: list[str], fn: Callable[[list[str]], list[str]]) -> list[str]:
    return [" ".join(fn(t.split())) if t.split() else t for t in texts]


@register_transform("identity", "text")
def _text_identity(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    return [list(texts)]


@register_transform("word_dropout", "text", random=True)
def _word_dropout(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    """Drop each word with probability 0.1 (always keeping one)."""

    def drop(words: list[str]) -> list[str]:
        kept = [w for w in words if rng.random() >= 0.1]
        return kept or words[:1]

    return [_words(texts, drop)]


@register_transform("word_swap", "text", random=True)
def _word_swap(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    """Swap one random pair of neighbouring words."""

    def swap(words: list[str]) -> list[str]:
        if len(words) < 2:
            return words
        i = int(rng.integers(len(words) - 1))
        return [*words[:i], words[i + 1], words[i], *words[i + 2 :]]

    return [_words(texts, swap)]


@register_transform("truncate_head", "text")
def _truncate_head(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    """Keep the last 80% of the words."""
    return [_words(texts, lambda w: w[len(w) - max(1, round(0.8 * len(w))) :])]


@register_transform("truncate_tail", "text")
def _truncate_tail(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    """Keep the first 80% of the words."""
    return [_words(texts, lambda w: w[: max(1, round(0.8 * len(w)))])]


@register_transform("lower", "text")
def _lower(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    return [[t.lower() for t in texts]]


@register_transform("upper", "text")
def _upper(texts: list[str], rng: np.random.Generator) -> list[list[str]]:
    return [[t.upper() for t in texts]]
