"""What an image-text-to-text package needs at run time besides its graphs, in numpy and without model code.

- **Prompts**: the processor's chat template with one image part per image, else the image placeholder before
  the text (:func:`build_prompt`).
- **Vision items**: the vision encoder runs once per item of the processor's vision inputs: per image, or per
  prompt row for processors that split an image into crops (rows of their 5-D ``pixel_values``); packed patches
  (``image_grid_thw``) are cut per image by each image's grid (:func:`vision_items`).
- **Precomputed vision inputs**: where a vision tower computes tensors from the grid with transformers'
  ``vision_utils`` helpers (rotary positions, attention segment boundaries: Python loops over the grid that no
  graph can hold), the package's vision graph takes them as inputs and :data:`VISION_PRECOMPUTE` computes them
  here, as those helpers do (the export checks that they are equal).
- **Merging**: each image's features replace its placeholder tokens' embeddings, in order
  (:func:`merge_image_features`), as transformers' ``masked_scatter`` does.
- **Positions**: the decoder's ``position_ids`` for a prompt, as ``generate`` prepares them
  (:data:`POSITION_SCHEMES`: 1-D positions, or M-RoPE's text row plus (t, h, w) rows); every generated token
  then takes the last position + 1 in every row, as ``generate`` extends them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._registry import Registry
from ..errors import InferenceError, MetadataError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage
    from transformers import ProcessorMixin

__all__ = [
    "POSITION_SCHEMES",
    "PositionScheme",
    "VISION_PRECOMPUTE",
    "VisionPrecompute",
    "build_prompt",
    "merge_image_features",
    "next_positions",
    "position_scheme",
    "precomputed_inputs",
    "synthetic_image",
    "vision_items",
    "vision_precompute",
]

Feeds = dict[str, np.ndarray]


# ------------------------------------------------------------------------------------------------ prompts
def build_prompt(processor: ProcessorMixin, text: str, images: int = 1) -> str:
    """The prompt for ``text`` about ``images`` images: the chat template's user turn and generation prompt when
    the processor has a template, else the processor's image placeholder before the text (processors that
    insert the placeholder themselves add none when the text already holds it)."""
    if getattr(processor, "chat_template", None):
        content = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
        messages = [{"role": "user", "content": content}]
        return str(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    token = str(getattr(processor, "image_token", "") or "")
    return text if token and token in text else token * images + text


def synthetic_image(height: int, width: int, seed: int = 0) -> PILImage:
    """A PIL image: a smooth colour gradient with noise, the same on every machine (example inputs of exports,
    profiles and tests, where no photo is given)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / max(width - 1, 1), y / max(height - 1, 1), (x + y) / max(height + width - 2, 1)], -1)
    noisy = base * 200 + rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.minimum(np.maximum(noisy, 0), 255).astype(np.uint8))


# --------------------------------------------------------------------------------------- vision items
def vision_items(feeds: Feeds, names: list[str], grid: str | None) -> Iterator[Feeds]:
    """The vision encoder's inputs one item at a time: axis 0 of each input cut into items of one, or, with a
    ``grid`` input (``image_grid_thw``: one row per image), the other inputs' rows cut by each image's
    ``t * h * w`` patches."""
    present = [n for n in names if n in feeds]
    if not present:
        return
    if grid is None:
        for i in range(len(feeds[present[0]])):
            yield {n: np.ascontiguousarray(feeds[n][i : i + 1]) for n in present}
        return
    counts = np.prod(feeds[grid], axis=1).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    for i, (start, end) in enumerate(itertools.pairwise(starts)):
        yield {
            n: np.ascontiguousarray(feeds[n][i : i + 1] if n == grid else feeds[n][start:end])
            for n in present
        }


@dataclass(frozen=True)
class VisionPrecompute:
    """A tensor a vision tower computes from the image grid with a transformers ``vision_utils`` helper, taken by
    the vision graph as input ``graph_input`` (the tower's keyword ``kwarg``)."""

    getter: str
    kwarg: str
    graph_input: str
    compute: Callable[..., np.ndarray]


#: transformers ``vision_utils`` helper name -> how to compute its tensor here.
VISION_PRECOMPUTE: Registry[VisionPrecompute] = Registry("vision precompute", error=MetadataError)


def vision_precompute(
    getter: str, kwarg: str, graph_input: str
) -> Callable[[Callable[..., np.ndarray]], Callable[..., np.ndarray]]:
    return VISION_PRECOMPUTE.register_as(getter, lambda fn: VisionPrecompute(getter, kwarg, graph_input, fn))


def _cu_seqlens(grid: np.ndarray, merge_temporal: bool = False) -> np.ndarray:
    grid = np.asarray(grid, dtype=np.int64)
    seqlens = (
        grid[:, 0] * grid[:, 1] * grid[:, 2]
        if merge_temporal
        else np.repeat(grid[:, 1] * grid[:, 2], grid[:, 0])
    )
    return np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32)


@vision_precompute("get_vision_cu_seqlens", "cu_seqlens", "cu_seqlens")
def _vision_cu_seqlens(grid: np.ndarray, merge_temporal: bool = False) -> np.ndarray:
    """Each frame's patches are one attention segment (the whole video with ``merge_temporal``)."""
    return _cu_seqlens(grid, merge_temporal)


@vision_precompute("get_vision_attention_seqlens", "cu_seqlens", "cu_seqlens")
def _vision_attention_seqlens(grid: np.ndarray, merge_temporal: bool = False) -> np.ndarray:
    return _cu_seqlens(grid, merge_temporal)


@vision_precompute("get_vision_position_ids", "position_ids", "vision_position_ids")
def _vision_position_ids(
    grid: np.ndarray, spatial_merge_size: int, include_temporal: bool = False
) -> np.ndarray:
    """(h, w) rotary indices of every patch, block-major over the ``m x m`` merge blocks, repeated per frame
    (with ``include_temporal``: (t, h, w))."""
    m = int(spatial_merge_size)
    rows = []
    for t, h, w in np.asarray(grid, dtype=np.int64).tolist():
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // m, m, w // m, m)
        hpos = hpos.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        wpos = wpos.reshape(block).transpose(0, 2, 1, 3).reshape(-1)
        if include_temporal:
            tpos = np.repeat(np.arange(t), h * w)
            rows.append(np.stack([tpos, np.tile(hpos, t), np.tile(wpos, t)], axis=-1))
        else:
            rows.append(np.tile(np.stack([hpos, wpos], axis=-1), (t, 1)))
    return np.concatenate(rows).astype(np.int64)


def precomputed_inputs(grid: np.ndarray, record: dict[str, dict[str, Any]]) -> Feeds:
    """The vision graph's precomputed inputs for images with this grid: ``record`` is the package's
    ``{graph input: {"getter": ..., "params": {...}}}``."""
    out: Feeds = {}
    for name, entry in record.items():
        spec = VISION_PRECOMPUTE.find(str(entry.get("getter")))
        if spec is None:
            raise MetadataError(
                f"the package's vision input {name!r} is computed by {entry.get('getter')!r}, which this version "
                f"cannot compute (known: {', '.join(VISION_PRECOMPUTE)})",
                hint="upgrade modelexport, or re-export the model with this version",
            )
        out[name] = spec.compute(grid, **dict(entry.get("params") or {}))
    return out


# ------------------------------------------------------------------------------------------------ merging
def merge_image_features(
    embeds: np.ndarray, ids: np.ndarray, features: np.ndarray, image_token_id: int
) -> np.ndarray:
    """``embeds`` with the rows of ``features`` in place of the image tokens' embeddings, in order (row-major
    over the batch, as ``masked_scatter``); the counts must agree."""
    slots = ids == int(image_token_id)
    if int(slots.sum()) != len(features):
        raise InferenceError(
            f"the prompts hold {int(slots.sum())} image tokens but the vision encoder gave {len(features)} "
            "feature rows",
            hint="pass one image per image placeholder of the prompt (the chat template adds one per image)",
        )
    merged = np.array(embeds, copy=True)
    merged[slots] = features.astype(merged.dtype, copy=False)
    return merged


# ---------------------------------------------------------------------------------------------- positions
PositionFn = Callable[[np.ndarray, np.ndarray, Feeds, dict[str, Any]], np.ndarray]
#: fn(model config as a dict, the shape of ``generate``'s position_ids) -> the scheme's parameters, or None
#: where the scheme cannot give that shape for this model.
ParamsFn = Callable[[dict[str, Any], tuple[int, ...]], dict[str, Any] | None]


@dataclass(frozen=True)
class PositionScheme:
    """How a prompt's ``position_ids`` are computed: ``compute(input_ids, attention_mask, processor outputs,
    params)``; ``params`` reads what it needs from the model config (recorded in the package at export)."""

    name: str
    compute: PositionFn
    params: ParamsFn


#: scheme name -> :class:`PositionScheme`; the export records the one that gives ``generate``'s positions.
POSITION_SCHEMES: Registry[PositionScheme] = Registry("position scheme", error=MetadataError)


def position_scheme(name: str, params: ParamsFn) -> Callable[[PositionFn], PositionFn]:
    return POSITION_SCHEMES.register_as(name, lambda fn: PositionScheme(name, fn, params))


def _text_positions(mask: np.ndarray) -> np.ndarray:
    positions = np.cumsum(mask, axis=-1) - 1
    return np.where(mask == 0, 0, positions).astype(np.int64)


@position_scheme("text", lambda config, shape: {} if len(shape) == 2 else None)
def _text(ids: np.ndarray, mask: np.ndarray, feeds: Feeds, params: dict[str, Any]) -> np.ndarray:
    """``[batch, sequence]``: each real token's index among the row's real tokens (padding 0)."""
    return _text_positions(mask)


def _mrope_params(config: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any] | None:
    merge = (config.get("vision_config") or {}).get("spatial_merge_size")
    if len(shape) != 3 or shape[0] not in (3, 4) or not merge:
        return None
    return {"spatial_merge_size": int(merge), "text_row": shape[0] == 4}


@position_scheme("mrope", _mrope_params)
def _mrope(ids: np.ndarray, mask: np.ndarray, feeds: Feeds, params: dict[str, Any]) -> np.ndarray:
    """Multimodal rotary positions ``[rows, batch, sequence]``: text tokens advance (t, h, w) together; an
    image's tokens take their grid cell (merged ``spatial_merge_size`` x ``spatial_merge_size``) offset by the
    position before the image, and the text after it continues from there + the larger merged side. With
    ``text_row`` the 1-D text positions come first (``generate``'s four rows)."""
    merge = int(params["spatial_merge_size"])
    types = feeds.get("mm_token_type_ids")
    if types is None:
        raise InferenceError("the processor gave no mm_token_type_ids, which M-RoPE positions need")
    grids = {1: iter(np.asarray(feeds.get("image_grid_thw", np.zeros((0, 3))), dtype=np.int64))}
    if "video_grid_thw" in feeds:
        grids[2] = iter(np.asarray(feeds["video_grid_thw"], dtype=np.int64))
    out = np.zeros((3, *ids.shape), dtype=np.int64)
    for row in range(len(ids)):
        real = mask[row].astype(bool)
        parts, current = [], 0
        for kind, group in itertools.groupby(types[row][real].tolist()):
            length = len(list(group))
            if kind == 0:
                parts.append(np.broadcast_to(np.arange(length) + current, (3, length)))
                current += length
                continue
            t, h, w = (int(v) for v in next(grids[kind]))
            tt, hh, ww = np.meshgrid(
                np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij"
            )
            parts.append(np.stack([tt + current, hh + current, ww + current]).reshape(3, -1))
            current += max(h, w) // merge
        out[:, row, real] = np.concatenate(parts, axis=1)
    if params.get("text_row"):
        out = np.concatenate([_text_positions(mask)[None], out])
    return out


def next_positions(positions: np.ndarray, new: int = 1) -> np.ndarray:
    """The positions of ``new`` tokens after ``positions`` (``[..., sequence]``): the last + 1, + 2, ... in every
    row, as ``generate`` extends ``position_ids``."""
    return positions[..., -1:] + np.arange(1, new + 1, dtype=positions.dtype)
