"""Vision-language generation on ONNX Runtime: ``image-text-to-text`` on a package exported with
``--task image-text-to-text[-with-past]`` (``vision_encoder.onnx``, ``embed_tokens.onnx``, a decoder).

The model's own processor turns each (images, prompt) pair into the prompt of its chat template, token ids and
vision inputs. The vision encoder runs once per image (per prompt row for processors that split images into
crops), with the inputs it takes precomputed here from the image grid; the token embedding graph embeds the
prompt, and the image features replace the placeholder tokens' rows. The decoder then runs the text-generation
pipeline's decoding loop (greedy, sampling, beams, repetition penalty, EOS, left padding): the first step takes
the whole prompt's embeddings and ``generate``'s positions; every later step embeds the new token, takes the
last position + 1 (all M-RoPE rows) and, with a cache, binds the previous step's ``present.*`` OrtValues as its
past. Nothing here names an architecture: what differs between models is in the package's metadata
(:mod:`..multimodal`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...errors import ConfigError, InferenceError, MetadataError
from ...metadata.schema import CACHE_INPUT_PREFIX, KEY_TASK
from ...metadata.store import read_metadata
from ...metadata.tasks import normalize_task
from ...onnxfile import package_components, resolve_model_path
from ...runtime.session import create_session
from ..multimodal import (
    POSITION_SCHEMES,
    merge_image_features,
    next_positions,
    precomputed_inputs,
    synthetic_image,
    vision_items,
)
from ..processors import BaseONNXProcessor
from ..processors.base import ImageInput
from ..processors.vision_text import ONNXVisionTextProcessor
from .base import register_pipeline
from .generation import GenerationSettings, TextGenerationPipeline, _Cache, device_of, run_bound

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, OrtValue

__all__ = [
    "ImageTextToTextPipeline",
    "check_images",
    "is_vision_text_package",
    "pair_inputs",
    "ROLES",
    "TASK",
]

TASK = "image-text-to-text"

#: The package's graphs by role, in the order they run.
ROLES = ("vision_encoder", "embed_tokens", "decoder")


def pair_inputs(
    images: ImageInput | Sequence[ImageInput | Sequence[ImageInput]], texts: str | Sequence[str] | None
) -> list[dict[str, Any]]:
    """(image, prompt) items: lists of equal length pair up in order; one text goes with every image, one image
    with every text. An item's ``images`` may be a list (several images in one prompt)."""
    imgs = list(images) if isinstance(images, (list, tuple)) else [images]
    txts = [texts] if isinstance(texts, str) else list(texts or [])
    if not imgs or not txts:
        raise ConfigError("image-text-to-text needs at least one image and one text prompt")
    if len(imgs) != len(txts) and 1 not in (len(imgs), len(txts)):
        raise ConfigError(
            f"{len(imgs)} images and {len(txts)} prompts: give as many of each, or one image (or one prompt) for all"
        )
    n = max(len(imgs), len(txts))
    return [
        {"images": imgs[i if len(imgs) > 1 else 0], "text": str(txts[i if len(txts) > 1 else 0])}
        for i in range(n)
    ]


def is_vision_text_package(model: str | os.PathLike[str], task: str | None = None) -> bool:
    """Whether ``model`` runs as image-text-to-text: ``task`` says so, else the package's embedded task (read
    from the metadata alone: no graph is loaded)."""
    if task is not None:
        return normalize_task(task) == TASK
    return read_metadata(resolve_model_path(model)).get(KEY_TASK) == TASK


def check_images(model: str | os.PathLike[str], images: Sequence[ImageInput]) -> None:
    """Refuse an image the package's processor cannot take, before any graph is loaded
    (:class:`~modelexport.errors.ImageInputError`)."""
    file = resolve_model_path(model)
    ONNXVisionTextProcessor.from_folder(file.parent, []).check_images(list(images))


@dataclass(frozen=True)
class _State:
    """Between decoding steps: the cache OrtValues (with a cache), the embeddings so far (without), the
    positions and token types so far, and whether the next step is the first."""

    first: bool
    embeds: np.ndarray | None
    positions: np.ndarray | None
    token_types: np.ndarray | None
    past: list[OrtValue] | None


@register_pipeline(TASK)
class ImageTextToTextPipeline(TextGenerationPipeline):
    """``[{"input_text": prompt, "generated_text": answer}]`` per (image, prompt) pair: the continuation after the
    chat template's generation prompt (transformers' ``return_full_text=False``)."""

    processor_kinds = ("image_text_processor",)
    processor_arg = "processor"
    pipeline_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, session: InferenceSession, processor: BaseONNXProcessor, **kwargs: object) -> None:
        super().__init__(session, processor, **kwargs)
        folder = self.model_path.parent if self.model_path else None
        graphs = package_components(folder, self.model_path) if folder else {}
        missing = [r for r in ROLES if r not in graphs]
        if missing or not self.record.get("components"):
            raise MetadataError(
                f"image-text-to-text needs the graphs of a vision-language package; {folder or 'the model'} has "
                f"no {', '.join(missing) or 'image-text-to-text record'}",
                hint="export with --task image-text-to-text-with-past and pass the output folder",
            )
        own = {str(self.model_path): session} if self.model_path else {}
        self.graphs = {
            role: own.get(str(path)) or create_session(path, self.session_config)[0]
            for role, path in graphs.items()
        }
        self.decoder = self.graphs["decoder"]
        names = [i.name for i in self.decoder.get_inputs()]
        self.cache = (
            _Cache(self.decoder, self.record)
            if any(n.startswith(CACHE_INPUT_PREFIX) for n in names)
            else None
        )
        self.input_names = names
        self.vision_record: dict[str, Any] = dict(self.record.get("vision") or {})
        self.image_token_id = int(self.record["image_token_id"])

    # ----------------------------------------------------------------------------------------- graphs
    def _run(self, role: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        session = self.graphs[role]
        wanted = {i.name for i in session.get_inputs()}
        try:
            return session.run(None, {k: v for k, v in feeds.items() if k in wanted})[0]
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
            shapes = {k: list(v.shape) for k, v in feeds.items() if k in wanted}
            raise InferenceError(f"{role} failed on inputs {shapes}: {type(exc).__name__}: {exc}") from exc

    def image_features(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Every image's features, in placeholder order: the vision encoder once per item."""
        names = list(self.vision_record.get("inputs") or [])
        grid = self.vision_record.get("grid")
        precomputed = dict(self.vision_record.get("precomputed") or {})
        parts = []
        for item in vision_items(feeds, names, grid):
            if grid is not None and precomputed:
                item = {**item, **precomputed_inputs(item[grid], precomputed)}
            parts.append(self._run("vision_encoder", item))
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return self._run("embed_tokens", {"input_ids": np.ascontiguousarray(ids, dtype=np.int64)})

    def prompt_positions(self, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
        """The prompt's ``position_ids`` by the package's scheme (None: the decoder takes none)."""
        entry = self.record.get("positions")
        if not entry or "position_ids" not in self.input_names:
            return None
        scheme = POSITION_SCHEMES.find(str(entry["scheme"]))
        if scheme is None:
            raise MetadataError(
                f"the package's position scheme {entry['scheme']!r} is unknown here "
                f"(known: {', '.join(POSITION_SCHEMES)})",
                hint="upgrade modelexport, or re-export the model with this version",
            )
        return scheme.compute(
            feeds["input_ids"], feeds["attention_mask"], feeds, dict(entry.get("params") or {})
        )

    # ------------------------------------------------------------------------------ decoding steps
    def _begin(
        self, ids: np.ndarray, mask: np.ndarray, context: dict[str, np.ndarray] | None, room: int = 0
    ) -> _State:
        """Image features merged into the prompt's embeddings; positions and token types (each prompt row
        repeated for its beams). ``context``: the processor's feeds (:meth:`generate_from` always gives them);
        ``room`` is unused (the decoder's cache grows by concatenation)."""
        feeds: dict[str, np.ndarray] = context
        embeds = merge_image_features(
            self.embed(feeds["input_ids"]),
            feeds["input_ids"],
            self.image_features(feeds),
            self.image_token_id,
        )
        positions = self.prompt_positions(feeds)
        types = feeds.get("token_type_ids") if "token_type_ids" in self.input_names else None
        per_row = len(ids) // len(feeds["input_ids"])
        if per_row > 1:
            embeds = np.repeat(embeds, per_row, axis=0)
            positions = None if positions is None else np.repeat(positions, per_row, axis=-2)
            types = None if types is None else np.repeat(types, per_row, axis=0)
        past = self.cache.empty(len(ids)) if self.cache else None
        return _State(True, embeds, positions, None if types is None else types.astype(np.int64), past)

    def _advance(
        self, ids: np.ndarray, mask: np.ndarray, new: int, past: _State
    ) -> tuple[np.ndarray, _State]:
        state: _State = past
        embeds, positions, types = state.embeds, state.positions, state.token_types
        if not state.first:
            token = self.embed(ids[:, -1:])
            embeds = token if self.cache else np.concatenate([embeds, token], axis=1)
            positions = (
                None if positions is None else np.concatenate([positions, next_positions(positions)], -1)
            )
            types = None if types is None else np.concatenate([types, self._generated_types(types)], 1)
        fed_positions = (
            positions if positions is None or state.first or not self.cache else positions[..., -1:]
        )
        feeds = {"inputs_embeds": np.ascontiguousarray(embeds), "attention_mask": mask}
        if fed_positions is not None:
            feeds["position_ids"] = np.ascontiguousarray(fed_positions)
        if types is not None:
            feeds["token_type_ids"] = types
        if self.cache is None:
            scores = self._run("decoder", feeds)[:, -1, :]
            return scores, _State(False, embeds, positions, types, None)
        bound = dict(zip(self.cache.in_names, state.past or [], strict=True))
        scores, cache = run_bound(self.decoder, feeds, bound, self.cache.out_names, device_of(self.decoder))
        return scores, _State(False, None, positions, types, cache)

    def _generated_types(self, types: np.ndarray) -> np.ndarray:
        """A generated token's type, as ``generate`` gives it: the row's last type, or the package's constant."""
        constant = self.record.get("generated_token_type")
        return types[:, -1:] if constant is None else np.full((len(types), 1), int(constant), types.dtype)

    def _reorder(self, past: _State, order: np.ndarray) -> _State:
        state: _State = past
        take = lambda a, axis=0: None if a is None else np.take(a, order, axis=axis)  # noqa: E731
        return replace(
            state,
            embeds=take(state.embeds),
            positions=take(state.positions, -2),
            token_types=take(state.token_types),
            past=super()._reorder(state.past, order),
        )

    # ------------------------------------------------------------------------------------ public
    def component_feeds(
        self, image: ImageInput | None = None, text: str = "Describe the image."
    ) -> dict[str, dict[str, np.ndarray]]:
        """Each graph's inputs for one prompt about ``image`` (default: a synthetic photo), as generation feeds
        them: the first image item, the prompt's ids, the decoder's first step (an empty past). What ``profile``
        runs each graph of the package on."""
        feeds = self.processor(
            texts=[text], images=[image if image is not None else synthetic_image(96, 128)]
        )
        names = list(self.vision_record.get("inputs") or [])
        grid, precomputed = self.vision_record.get("grid"), dict(self.vision_record.get("precomputed") or {})
        vision = next(vision_items(feeds, names, grid))
        if grid is not None and precomputed:
            vision = {**vision, **precomputed_inputs(vision[grid], precomputed)}
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        state = self._begin(ids, mask, feeds)
        decoder: dict[str, np.ndarray] = {"inputs_embeds": state.embeds, "attention_mask": mask}
        if state.positions is not None:
            decoder["position_ids"] = state.positions
        if state.token_types is not None:
            decoder["token_type_ids"] = state.token_types
        if self.cache is not None:
            decoder.update({n: v.numpy() for n, v in zip(self.cache.in_names, state.past or [], strict=True)})
        return {"vision_encoder": vision, "embed_tokens": {"input_ids": ids}, "decoder": decoder}

    def generate_from(
        self,
        feeds: dict[str, np.ndarray],
        settings: GenerationSettings,
        streamer: Callable[[np.ndarray], None] | None = None,
    ) -> np.ndarray:
        """Token ids (the prompt, then the generated ones) for the processor's ``feeds`` of a batch of prompts."""
        return self.generate(feeds["input_ids"], feeds["attention_mask"], settings, streamer, context=feeds)

    def normalize(self, inputs: object, kwargs: dict[str, Any]) -> tuple[list[Any], bool]:
        """Items from ``{"images": ..., "text": ...}`` dicts (or one), or from ``images=`` and ``text=``."""
        images, text = kwargs.pop("images", None), kwargs.pop("text", None)
        if inputs is None and (images is not None or text is not None):
            items = pair_inputs(images, text)
            return items, len(items) == 1 and not isinstance(images, (list, tuple))
        single = isinstance(inputs, dict)
        items = [inputs] if single else list(inputs or [])
        bad = [
            i
            for i in items
            if not isinstance(i, dict) or "text" not in i or not ({"image", "images"} & set(i))
        ]
        if not items or bad:
            raise ConfigError(
                "image-text-to-text takes {'images': image(s), 'text': prompt} items, or images=... and text=...",
                hint="e.g. pipe({'images': 'photo.png', 'text': 'Describe the image.'})",
            )
        return [{"images": i.get("images", i.get("image")), "text": str(i["text"])} for i in items], single

    def run_batch(
        self, items: list[Any], streamer: Callable[[str], None] | None = None, **kwargs: object
    ) -> list[Any]:
        kwargs.pop("return_full_text", None)
        settings = self.settings(**kwargs)
        texts = [str(i["text"]) for i in items]
        feeds = self.processor(texts=texts, images=[i["images"] for i in items])
        stream = self._text_stream(streamer) if streamer is not None and len(items) == 1 else None
        out = self.generate_from(feeds, settings, stream)
        length = feeds["input_ids"].shape[1]
        prompts = self.processor.prompts(
            texts, [len(i) if isinstance(i, (list, tuple)) else 1 for i in (x["images"] for x in items)]
        )
        return [
            [
                {
                    "input_text": p,
                    "generated_text": self.tokenizer.decode(row[length:], skip_special_tokens=True),
                }
            ]
            for p, row in zip(prompts, out, strict=True)
        ]
