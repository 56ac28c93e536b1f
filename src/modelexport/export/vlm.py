"""Vision-language generation export (``image-text-to-text``, ``image-text-to-text-with-past``).

Three graphs in one folder, the split transformers.js and onnx-community packages use, with their names:

- ``vision_encoder.onnx``: the processor's vision inputs (``pixel_values``, and ``image_grid_thw`` /
  ``pixel_attention_mask`` where the processor gives them) -> ``image_features`` ``[image tokens, hidden]``:
  the vision tower and the projector / merger / connector, i.e. the model's ``get_image_features()``, one row
  per image placeholder token. It runs once per image (per prompt row for processors that split images into
  crops): a packed-patch tower attends within each image through a Python loop over the images, which no
  graph can hold for a varying count, while the patch or crop count stays dynamic.
- ``embed_tokens.onnx``: ``input_ids`` -> ``inputs_embeds`` (``get_input_embeddings()``); the runtime writes
  the image features over the placeholder tokens' rows (transformers' ``masked_scatter``).
- ``decoder_model_merged.onnx`` (with a cache): ``inputs_embeds``, ``attention_mask``, ``position_ids``
  (``[4, batch, sequence]`` for M-RoPE), ``token_type_ids`` where the model takes them (bidirectional
  attention over image tokens), ``past_key_values.{i}.key/value`` -> ``logits``, ``present.{i}.key/value``; one
  graph for the first step (empty past) and every later one. Without a cache, ``decoder_model.onnx``.

Every graph is captured from the whole model, called through its own APIs (``get_image_features``,
``get_input_embeddings``, ``forward(inputs_embeds=...)``): a step function stands in for ``forward`` during
capture (:class:`.steps.StepInputs`), so tags are paths of one module tree. The example inputs come from the
model's own processor and chat template on synthetic images of several sizes; before any capture the split is
checked in PyTorch against the whole model's logits, the runtime's positions against ``generate``'s and the
runtime's precomputed vision inputs against transformers' (:mod:`..inference.multimodal`). Each graph is then
checked against PyTorch on every example (other image sizes, an empty past). No architecture is named.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._transformers import cache_parameter, load_processor, major_version, output_cache, transformers_version
from ..errors import ConfigError, ExportError, first_line
from ..inference.multimodal import (
    POSITION_SCHEMES,
    VISION_PRECOMPUTE,
    build_prompt,
    merge_image_features,
    precomputed_inputs,
    synthetic_image,
    vision_items,
)
from ..metadata.tasks import normalize_task
from .config import ExportConfig, InputSpec
from .generation import (
    cache_layout,
    cache_names,
    dynamic_cache,
    dynamic_cache_leaves,
    is_with_past,
    register_cache_pytree,
)
from .inputs import forward_parameters
from .seq2seq import refuse_graph_set_options
from .steps import StepFn, StepInputs

if TYPE_CHECKING:
    import torch
    from transformers.cache_utils import Cache
    from transformers.processing_utils import ProcessorMixin

    from .loading import LoadedModel

__all__ = [
    "VLM_TASK",
    "VISION_FILE",
    "EMBED_FILE",
    "DECODER_FILE",
    "MERGED_DECODER_FILE",
    "EXAMPLE_IMAGE_SIZES",
    "CHECK_IMAGE_SIZES",
    "is_vlm_task",
    "is_vision_language_model",
    "VLM_HINT",
    "vlm_files",
    "check_vlm_config",
    "build_vlm_inputs",
]

VLM_TASK = "image-text-to-text"
VISION_FILE = "vision_encoder.onnx"
EMBED_FILE = "embed_tokens.onnx"
DECODER_FILE = "decoder_model.onnx"
MERGED_DECODER_FILE = "decoder_model_merged.onnx"
#: (height, width) of the synthetic example images: two prompts of a batch, then a prompt checked alone (a wide
#: image: another patch or crop count for processors that keep the aspect ratio).
EXAMPLE_IMAGE_SIZES = ((48, 64), (96, 72))
CHECK_IMAGE_SIZES = ((40, 120),)
EXAMPLE_PROMPTS = ("Describe the image.", "What is in this picture? Answer in one word.")
#: The split must give the whole model's logits within this (float32: two graphs of the same arithmetic).
SPLIT_ATOL = 1e-4


def is_vlm_task(cfg: ExportConfig) -> bool:
    """``image-text-to-text`` with or without ``-with-past``: the three-graph package."""
    return bool(cfg.task) and normalize_task(str(cfg.task)) == VLM_TASK


def vlm_files(cfg: ExportConfig) -> tuple[str, ...]:
    """The package's graphs, in the order they run."""
    return (VISION_FILE, EMBED_FILE, MERGED_DECODER_FILE if is_with_past(cfg) else DECODER_FILE)


def check_vlm_config(cfg: ExportConfig) -> None:
    """The options this export refuses, checked before the model loads."""
    if cfg.exporter != "dynamo":
        raise ConfigError(f"task {cfg.task} needs the dynamo exporter, not {cfg.exporter}")
    if cfg.input_specs or cfg.static_shapes or cfg.input_shape or cfg.text is not None:
        raise ConfigError(
            f"task {cfg.task} builds its inputs from the model's processor, with dynamic shapes",
            hint="leave out --input-specs, --input-shape, --text and --static-shapes",
        )
    refuse_graph_set_options(
        cfg,
        [
            f"{o} {getattr(cfg, o)}"
            for o, plain in (("dtype", "float32"), ("device", "cpu"))
            if getattr(cfg, o) != plain
        ],
        "export in float32 on the CPU, without it",
        "the decoder's activation ranges depend on the step, the past length and the image, and the export has "
        "one example of each",
        "int8 weights, activation ranges computed at run time",
    )
    found = major_version(transformers_version())
    if found is not None and found < 5:
        raise ConfigError(
            f"task {cfg.task} needs transformers 5 (its models' get_image_features() and inputs_embeds "
            f"generation); transformers {transformers_version()} is installed",
            hint="export in the environment of `make test` (.venv)",
        )


# -------------------------------------------------------------------------------------------------- steps
def _vision_step(
    renames: dict[str, str], call: StepFn | None, module: torch.nn.Module, **inputs: torch.Tensor
) -> torch.Tensor:
    """``get_image_features`` of one item, as ``[image tokens, hidden]`` rows in placeholder order."""
    import torch

    out = module.get_image_features(**{renames.get(k, k): v for k, v in inputs.items()}, return_dict=True)
    features = out.pooler_output if hasattr(out, "pooler_output") else out
    if isinstance(features, (list, tuple)):
        features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
    return features.reshape(-1, features.shape[-1])


def _embed_step(call: StepFn | None, module: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    return module.get_input_embeddings()(input_ids)


def _decoder_step(
    cache_arg: str,
    with_past: bool,
    call: StepFn,
    module: torch.nn.Module,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    past_key_values: Cache | None = None,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The language model on merged embeddings: logits (and the grown cache, flattened per layer)."""
    kwargs: dict[str, Any] = {
        "inputs_embeds": inputs_embeds,
        "attention_mask": attention_mask,
        "use_cache": with_past,
        "return_dict": True,
    }
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    if with_past:
        kwargs[cache_arg] = past_key_values
    out = call(**kwargs)
    if not with_past:
        return out.logits
    return (out.logits, *dynamic_cache_leaves(output_cache(out)))


# ----------------------------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class _Example:
    """One processor call: its outputs (torch tensors) and what the runtime would compute from them."""

    batch: dict[str, Any]
    items: list[dict[str, Any]]  # the vision graph's inputs per item, precomputed inputs included
    features: torch.Tensor  # every item's image features, concatenated
    embeds: torch.Tensor  # the prompts' embeddings with the image features merged in
    positions: torch.Tensor | None


@contextlib.contextmanager
def _left_padding(processor: ProcessorMixin) -> Iterator[None]:
    """Prompts of a batch padded on the left (generation appends on the right); the tokenizer's setting after."""
    tok = processor.tokenizer
    side, pad = tok.padding_side, tok.pad_token
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    try:
        yield
    finally:
        tok.padding_side, tok.pad_token = side, pad


def _processor_batch(
    processor: ProcessorMixin, sizes: tuple[tuple[int, int], ...], seed: int
) -> dict[str, Any]:
    images = [synthetic_image(h, w, seed + i) for i, (h, w) in enumerate(sizes)]
    prompts = [build_prompt(processor, EXAMPLE_PROMPTS[i % len(EXAMPLE_PROMPTS)]) for i in range(len(sizes))]
    try:
        with _left_padding(processor):
            out = processor(text=prompts, images=[[im] for im in images], padding=True, return_tensors="pt")
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for inputs it cannot take
        raise ExportError(
            f"the model's processor ({type(processor).__name__}) fails on images of {list(sizes)}: "
            f"{type(exc).__name__}: {first_line(exc)}",
            hint="the folder's processor files must turn an image and a prompt into inputs, as "
            "AutoProcessor.from_pretrained(folder)(text=..., images=...) does",
        ) from exc
    return dict(out)


def _load_processor(loaded: LoadedModel, cfg: ExportConfig) -> ProcessorMixin:
    folder = loaded.model_dir
    if folder is None:
        raise ConfigError(
            f"task {cfg.task} builds its inputs with the model's processor: export a model folder that holds "
            "its processor files (processor_config.json or preprocessor_config.json, tokenizer, chat template)",
            hint="save_pretrained() the model and its processor into one folder and export that folder",
        )
    try:
        processor = load_processor(folder)
    except Exception as exc:  # noqa: BLE001 - what transformers raises for a folder without a processor varies
        raise ConfigError(
            f"task {cfg.task}: the processor of {folder} does not load ({type(exc).__name__}: {first_line(exc)})",
            hint="the folder needs the processor files AutoProcessor.from_pretrained() reads",
        ) from exc
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise ConfigError(
            f"task {cfg.task}: {folder} gives a {type(processor).__name__}, not a processor of images and text",
            hint="the folder needs an image processor and a tokenizer (a vision-language model's processor)",
        )
    return processor


def is_vision_language_model(module: torch.nn.Module) -> bool:
    """A generator of text from images and text, called through transformers' APIs: ``get_image_features()``,
    ``get_input_embeddings()``, ``forward(inputs_embeds=...)`` and an ``image_token_id`` in its config."""
    config = getattr(module, "config", None)
    apis = all(callable(getattr(module, a, None)) for a in ("get_image_features", "get_input_embeddings"))
    return (
        apis
        and getattr(config, "image_token_id", None) is not None
        and "inputs_embeds" in {p.name for p in forward_parameters(module)}
    )


#: What the default export of a vision-language model that fails says to do instead.
VLM_HINT = (
    "a vision-language model exports as a package of three graphs, with inputs from its own processor: "
    "--task image-text-to-text-with-past (or image-text-to-text, without a cache)"
)


def _check_model(module: torch.nn.Module, cfg: ExportConfig) -> int:
    """The image placeholder token id; ConfigError for a model that is not a vision-language generator."""
    if not is_vision_language_model(module):
        raise ConfigError(
            f"task {cfg.task} needs a vision-language model with get_image_features(), get_input_embeddings(), "
            f"forward(inputs_embeds=...) and an image_token_id in its config; {type(module).__name__} is not one",
            hint="text-only decoders export with --task text-generation-with-past",
        )
    return int(module.config.image_token_id)


# ---------------------------------------------------------------------------- precomputed vision inputs
def _vision_helpers(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """transformers ``vision_utils`` helpers named in the ``forward`` of the model's modules: name -> the
    globals of the modeling module that calls them (where a recorder can stand in during one eager run)."""
    found: dict[str, dict[str, Any]] = {}
    for cls in {type(m) for m in module.modules()}:
        fn = inspect.unwrap(cls.forward)
        code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
        for name in set(code.co_names if code else ()) & set(scope):
            if getattr(scope[name], "__module__", "") == "transformers.vision_utils":
                found[name] = scope
    return found


@contextlib.contextmanager
def _recording(
    helpers: dict[str, dict[str, Any]], calls: list[tuple[str, dict[str, Any], Any]]
) -> Iterator[None]:
    """While the block runs, each helper's calls are recorded: (name, bound arguments, result)."""
    originals = {name: scope[name] for name, scope in helpers.items()}

    def recorder(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def record(*args: object, **kwargs: object) -> Any:
            result = original(*args, **kwargs)
            calls.append((name, dict(signature.bind(*args, **kwargs).arguments), result))
            return result

        return record

    for name, scope in helpers.items():
        scope[name] = recorder(name, originals[name])
    try:
        yield
    finally:
        for name, scope in helpers.items():
            scope[name] = originals[name]


def _precompute_record(
    module: torch.nn.Module, item: dict[str, Any], grid: str | None
) -> dict[str, dict[str, Any]]:
    """Which tensors the vision tower computes from the grid with transformers' helpers (one eager run of
    ``get_image_features``, recorded), as ``{graph input: {"getter", "kwarg", "params"}}``."""
    import torch

    helpers = _vision_helpers(module)
    calls: list[tuple[str, dict[str, Any], Any]] = []
    with torch.no_grad(), _recording(helpers, calls):
        module.get_image_features(**item, return_dict=True)
    record: dict[str, dict[str, Any]] = {}
    for name, arguments, _ in calls:
        spec = VISION_PRECOMPUTE.find(name)
        if spec is None:
            raise ExportError(
                f"the vision tower computes inputs with transformers.vision_utils.{name}, which modelexport's "
                f"runtime cannot compute yet (it computes {', '.join(VISION_PRECOMPUTE)})",
                hint="this model family is not supported by the image-text-to-text export yet",
            )
        if grid is None:
            raise ExportError(f"the vision tower calls {name} but the processor gives no image grid")
        first = next(iter(inspect.signature(spec.compute).parameters))
        params = {
            k: v
            for k, v in arguments.items()
            if k != first
            and isinstance(v, (bool, int, float))
            and k in inspect.signature(spec.compute).parameters
        }
        record[spec.graph_input] = {"getter": name, "kwarg": spec.kwarg, "params": params}
    return record


def _with_precomputed(
    item: dict[str, Any], grid: str | None, record: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    import torch

    if not record or grid is None:
        return item
    extra = precomputed_inputs(item[grid].numpy(), record)
    return {**item, **{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in extra.items()}}


def _check_precomputed(
    module: torch.nn.Module, item: dict[str, torch.Tensor], record: dict[str, dict[str, Any]], grid: str
) -> None:
    """The runtime's precomputed inputs equal what transformers' helpers compute for this item."""
    import torch

    helpers = _vision_helpers(module)
    calls: list[tuple[str, dict[str, Any], Any]] = []
    plain = {k: v for k, v in item.items() if k not in record}
    with torch.no_grad(), _recording(helpers, calls):
        module.get_image_features(**plain, return_dict=True)
    ours = precomputed_inputs(item[grid].numpy(), record)
    for name, entry in record.items():
        theirs = [r for n, _, r in calls if n == entry["getter"]]
        value = theirs[0][0] if isinstance(theirs[0], tuple) else theirs[0]
        if not np.array_equal(np.asarray(value), ours[name]):
            raise ExportError(
                f"modelexport computes the vision input {name} ({entry['getter']}) unlike transformers for a "
                f"grid of {item[grid].tolist()}",
                hint="this model family is not supported by the image-text-to-text export yet",
            )


# -------------------------------------------------------------------------------------------------- split
@dataclass(frozen=True)
class _Split:
    """What the three graphs take, decided once from the model and its processor."""

    image_token_id: int
    vision_inputs: tuple[str, ...]
    grid: str | None
    precomputed: dict[str, dict[str, Any]]
    takes_positions: bool
    token_types: bool
    cache_arg: str

    @property
    def renames(self) -> dict[str, str]:
        return {name: entry["kwarg"] for name, entry in self.precomputed.items()}


def _split_of(module: torch.nn.Module, batch: dict[str, torch.Tensor], image_token_id: int) -> _Split:
    takes = {p.name for p in inspect.signature(module.get_image_features).parameters.values()}
    vision = tuple(k for k in batch if k in takes and k not in ("input_ids", "attention_mask"))
    if not vision:
        raise ExportError(
            f"the processor's outputs ({', '.join(batch)}) hold none of get_image_features()'s inputs "
            f"({', '.join(sorted(takes))})"
        )
    grid = next((n for n in vision if n.endswith("_grid_thw")), None)
    first = next(vision_items({k: batch[k].numpy() for k in vision}, list(vision), grid))
    item = {k: _tensor(v) for k, v in first.items()}
    params = {p.name for p in forward_parameters(module)}
    return _Split(
        image_token_id,
        vision,
        grid,
        _precompute_record(module, item, grid),
        "position_ids" in params,
        "token_type_ids" in batch and "token_type_ids" in params,
        cache_parameter(params) or "past_key_values",
    )


def _tensor(value: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.ascontiguousarray(value))


def _positions(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The prompt's ``position_ids`` as ``generate`` prepares them (transformers' own method)."""
    import torch

    prepare = getattr(module, "_prepare_position_ids_for_generation", None)
    if prepare is None:
        mask = batch["attention_mask"]
        return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        return prepare(batch["input_ids"], dict(batch))


def _example(module: torch.nn.Module, split: _Split, batch: dict[str, torch.Tensor]) -> _Example:
    import torch

    numpy_batch = {k: v.numpy() for k, v in batch.items()}
    items = [
        _with_precomputed({k: _tensor(v) for k, v in item.items()}, split.grid, split.precomputed)
        for item in vision_items(numpy_batch, list(split.vision_inputs), split.grid)
    ]
    step = functools.partial(_vision_step, split.renames)
    with torch.no_grad():
        features = torch.cat([step(None, module, **item) for item in items])
        embeds = _embed_step(None, module, batch["input_ids"])
    merged = merge_image_features(
        embeds.numpy(), numpy_batch["input_ids"], features.numpy(), split.image_token_id
    )
    positions = _positions(module, batch) if split.takes_positions else None
    return _Example(batch, items, features, torch.from_numpy(merged), positions)


def _decoder_kwargs(split: _Split, ex: _Example, start: int = 0, end: int | None = None) -> dict[str, Any]:
    """The decoder's inputs for the prompt's tokens ``start:end`` (masks and token types from position 0)."""
    kwargs = {
        "inputs_embeds": ex.embeds[:, start:end],
        "attention_mask": ex.batch["attention_mask"][:, :end],
    }
    if ex.positions is not None:
        kwargs["position_ids"] = ex.positions[..., start:end].contiguous()
    if split.token_types:
        kwargs["token_type_ids"] = ex.batch["token_type_ids"][:, :end]
    return kwargs


def _full_rows(kwargs: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rows of a prompt batch that hold no padding: a graph's outputs at padded query positions are
    arbitrary (every key masked) and differ between runtimes, so whole-prompt checks leave them out."""
    rows = mask.bool().all(dim=-1)
    return {
        k: (v[:, rows] if k == "position_ids" and v.dim() == 3 else v[rows]).contiguous()
        for k, v in kwargs.items()
    }


def _check_logits(module: torch.nn.Module, ex: _Example, logits: torch.Tensor, what: str, hint: str) -> None:
    """``logits`` (of the split, on ``ex``) equal the whole model's on the processor's outputs."""
    import torch

    whole_kwargs = {k: v for k, v in ex.batch.items() if k in {p.name for p in forward_parameters(module)}}
    with torch.no_grad():
        whole = module(**whole_kwargs, use_cache=False).logits
    mask = ex.batch["attention_mask"].bool()
    worst = float((whole - logits).abs()[mask].max())
    if worst > SPLIT_ATOL:
        raise ExportError(
            f"{what} does not reproduce {type(module).__name__}'s logits (max abs diff {worst:.3g})",
            hint=hint,
        )


def _check_split(module: torch.nn.Module, split: _Split, ex: _Example) -> None:
    """The split (vision features merged into the embeddings, positions) gives the whole model's logits."""
    import torch

    with torch.no_grad():
        logits = _decoder_step(split.cache_arg, False, module.forward, module, **_decoder_kwargs(split, ex))
    _check_logits(
        module,
        ex,
        logits,
        "the three-graph split (image features merged into the token embeddings, generate()'s positions)",
        "this model family is not supported by the image-text-to-text export yet",
    )


def _position_record(module: torch.nn.Module, examples: list[_Example]) -> dict[str, Any] | None:
    """The runtime's position scheme that gives ``generate``'s positions on every example, with its parameters."""
    if examples[0].positions is None:
        return None
    config = module.config.to_dict()
    shape = tuple(examples[0].positions.shape)
    for name, scheme in POSITION_SCHEMES.items():
        params = scheme.params(config, shape)
        if params is None:
            continue
        if all(
            np.array_equal(
                scheme.compute(
                    ex.batch["input_ids"].numpy(),
                    ex.batch["attention_mask"].numpy(),
                    {k: v.numpy() for k, v in ex.batch.items()},
                    params,
                ),
                ex.positions.numpy(),
            )
            for ex in examples
        ):
            return {"scheme": name, "params": params}
    raise ExportError(
        f"generate() prepares position_ids of shape {list(shape)} for {type(module).__name__} that none of "
        f"modelexport's position schemes ({', '.join(POSITION_SCHEMES)}) reproduces",
        hint="this model family is not supported by the image-text-to-text export yet",
    )


# ------------------------------------------------------------------------------------------------- graphs
def _axes_from(values: dict[str, list[Any]], fixed: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
    """Dynamic axes: ``fixed`` names, plus each axis whose size differs between the items (named after the
    first input and axis with that sequence of sizes, so equal axes share one name)."""
    axes = {name: dict(fixed.get(name, {})) for name in values}
    names: dict[tuple[int, ...], str] = {}
    for name, tensors in values.items():
        for axis in range(tensors[0].dim()):
            sizes = tuple(int(t.shape[axis]) for t in tensors)
            if axis in axes[name] or len(set(sizes)) == 1:
                continue
            axes[name][axis] = names.setdefault(sizes, f"{name}_dim_{axis}")
    return axes


def _spec(name: str, tensor: torch.Tensor, axes: dict[int, str]) -> InputSpec:
    return InputSpec(name, tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""), axes or None)


def _graph(
    file: str,
    role: str,
    examples: list[dict[str, Any]],
    axes: dict[str, dict[int, str]],
    outputs: tuple[str, ...],
    step: StepFn,
    record: dict[str, Any],
    labels: list[str],
    **extra: object,
) -> StepInputs:
    first = examples[0]
    specs = tuple(_spec(n, t, axes.get(n, {})) for n, t in first.items())
    checks = tuple(zip(labels, examples[1:], strict=True))
    return StepInputs(
        specs, first, outputs, file=file, step=step, record=record, role=role, checks=checks, **extra
    )


def _vision_graph(split: _Split, examples: list[_Example], record: dict[str, Any]) -> StepInputs:
    items = [item for ex in examples for item in ex.items]
    axes = _axes_from({n: [i[n] for i in items] for n in items[0]}, {})
    labels = [f"image {i + 1}" for i in range(1, len(items))]
    step = functools.partial(_vision_step, split.renames)
    return _graph(VISION_FILE, "vision_encoder", items, axes, ("image_features",), step, record, labels)


def _embed_graph(examples: list[_Example], record: dict[str, Any]) -> StepInputs:
    ids = [{"input_ids": ex.batch["input_ids"]} for ex in examples]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}}
    labels = [f"prompt set {i + 1}" for i in range(1, len(ids))]
    return _graph(EMBED_FILE, "embed_tokens", ids, axes, ("inputs_embeds",), _embed_step, record, labels)


def _decoder_axes(
    split: _Split, positions: torch.Tensor | None, with_past: bool
) -> dict[str, dict[int, str]]:
    seq = {0: "batch_size", 1: "sequence_length"}
    total = {0: "batch_size", 1: "past_sequence_length + sequence_length" if with_past else "sequence_length"}
    axes = {"inputs_embeds": seq, "attention_mask": total, "token_type_ids": total}
    if positions is not None:
        axes["position_ids"] = seq if positions.dim() == 2 else {1: "batch_size", 2: "sequence_length"}
    return axes


def _decoder_graph(split: _Split, examples: list[_Example], record: dict[str, Any]) -> StepInputs:
    """Without a cache: the whole prompt each step; checked on the other prompts too."""
    sets = [_full_rows(_decoder_kwargs(split, ex), ex.batch["attention_mask"]) for ex in examples]
    axes = _decoder_axes(split, examples[0].positions, with_past=False)
    step = functools.partial(_decoder_step, split.cache_arg, False)
    labels = [f"prompt set {i + 1}" for i in range(1, len(sets))]
    return _graph(DECODER_FILE, "decoder", sets, axes, ("logits",), step, record, labels)


def _prefill(
    module: torch.nn.Module, split: _Split, kwargs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """A real first step over ``kwargs`` into a plain (non-sliding) cache: the graph keeps every layer's past."""
    import torch
    from transformers.cache_utils import DynamicCache

    with torch.no_grad():
        out = _decoder_step(
            split.cache_arg, True, module.forward, module, **kwargs, past_key_values=DynamicCache()
        )
    return out[1:]


def _first_step(split: _Split, ex: _Example, empty: dict[str, Any]) -> dict[str, Any]:
    """The first step over the prompts without padding: the whole prompt after an empty past."""
    kwargs = _full_rows(_decoder_kwargs(split, ex), ex.batch["attention_mask"])
    rows = int(kwargs["inputs_embeds"].shape[0])
    return {
        **kwargs,
        **{n: t[:rows] if len(t) >= rows else t.expand(rows, *t.shape[1:]) for n, t in empty.items()},
    }


def _merged_decoder_graph(
    module: torch.nn.Module, split: _Split, examples: list[_Example], record: dict[str, Any]
) -> StepInputs:
    """A cached step (the prompt's tail after a real prefill of its head), checked on the first step (an empty
    past) of every example."""
    import torch

    ex = examples[0]
    length = int(ex.embeds.shape[1])
    past = length // 2 + 1 if length // 2 + 1 != length - (length // 2 + 1) else length // 2 + 2
    if past >= length:
        raise ExportError(f"the example prompt has only {length} tokens; too short for a cached step")
    flat = _prefill(module, split, _decoder_kwargs(split, ex, 0, past))
    layers = len(flat) // 2
    names = cache_names(layers, "past_key_values")
    empty = {
        n: torch.zeros((*t.shape[:2], 0, t.shape[3]), dtype=t.dtype) for n, t in zip(names, flat, strict=True)
    }
    with torch.no_grad():  # the graph's first step: the model called with a cache that is there but empty
        first = _decoder_step(
            split.cache_arg,
            True,
            module.forward,
            module,
            **_decoder_kwargs(split, ex),
            past_key_values=dynamic_cache(list(empty.values()), layers),
        )[0]
    _check_logits(
        module,
        ex,
        first,
        "the decoder's first step with an empty past",
        "the model attends differently on its first step than with a cache; export without one: "
        "--task image-text-to-text",
    )
    sets = [
        {**_decoder_kwargs(split, ex, past), **{n: t.clone() for n, t in zip(names, flat, strict=True)}},
        *(_first_step(split, other, empty) for other in examples),
    ]
    axes = _decoder_axes(split, ex.positions, with_past=True)
    axes.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in names})
    outputs = ("logits", *cache_names(layers, "present"))
    cache = dynamic_cache(flat, layers)
    record = {
        **record,
        "cache": cache_layout(cache),
        "cache_inputs": names,
        "cache_outputs": list(outputs[1:]),
    }
    labels = [f"first step, prompt set {i + 1}" for i in range(len(examples))]
    step = functools.partial(_decoder_step, split.cache_arg, True)
    return _graph(
        MERGED_DECODER_FILE,
        "decoder",
        sets,
        axes,
        outputs,
        step,
        record,
        labels,
        layers=layers,
        cache_from=dynamic_cache,
    )


def _generated_token_type(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int | None:
    """The token type ``generate`` gives each generated token (transformers' own update of its inputs after a
    step): None where it repeats the row's last type (transformers' default), else that constant (a model
    whose generated tokens form a causal suffix after a bidirectional prefix)."""
    from transformers.utils import ModelOutput

    update = getattr(module, "_update_model_kwargs_for_generation", None)
    if update is None:
        return None
    probe = batch["token_type_ids"].clone()
    probe[:, -1] = 7  # a type no model uses: repeated means "the last one"
    added = update(ModelOutput(), {"token_type_ids": probe, "attention_mask": batch["attention_mask"]})
    values = set(added["token_type_ids"][:, -1].tolist())
    if values == {7}:
        return None
    if len(values) != 1:
        raise ExportError(f"generate() gives generated tokens the token types {sorted(values)}; expected one")
    return int(values.pop())


def _record(
    split: _Split, positions: dict[str, Any] | None, generated_type: int | None, cfg: ExportConfig
) -> dict[str, Any]:
    files = vlm_files(cfg)
    return {
        "components": dict(zip(("vision_encoder", "embed_tokens", "decoder"), files, strict=True)),
        "image_token_id": split.image_token_id,
        "vision": {
            "inputs": list(split.vision_inputs),
            "grid": split.grid,
            "precomputed": split.precomputed,
            "output": "image_features",
        },
        "positions": positions,
        "token_type_ids": split.token_types,
        "generated_token_type": generated_type,
        "with_past": is_with_past(cfg),
    }


def build_vlm_inputs(loaded: LoadedModel, cfg: ExportConfig) -> list[StepInputs]:
    """The example inputs of the vision encoder, the token embedding and the decoder, in that order."""
    module = loaded.module
    check_vlm_config(cfg)
    image_token_id = _check_model(module, cfg)
    processor = _load_processor(loaded, cfg)
    register_cache_pytree()
    batches = [
        _processor_batch(processor, EXAMPLE_IMAGE_SIZES, 0),
        _processor_batch(processor, CHECK_IMAGE_SIZES, 7),
    ]
    split = _split_of(module, batches[0], image_token_id)
    examples = [_example(module, split, b) for b in batches]
    for ex in examples:
        if split.grid is not None and split.precomputed:
            for item in ex.items:
                _check_precomputed(module, item, split.precomputed, split.grid)
        _check_split(module, split, ex)
    generated = _generated_token_type(module, batches[0]) if split.token_types else None
    record = _record(split, _position_record(module, examples), generated, cfg)
    decoder = (
        _merged_decoder_graph(module, split, examples, record)
        if is_with_past(cfg)
        else _decoder_graph(split, examples, record)
    )
    shared = decoder.record  # the cache layout too: every graph's metadata describes the whole package
    return [_vision_graph(split, examples, shared), _embed_graph(examples, shared), decoder]
