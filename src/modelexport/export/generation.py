"""Generation export: a decoder graph that takes and returns its key/value cache (``*-with-past`` tasks).

The transformers cache object (``DynamicCache``) is an ordinary forward() argument; torch's pytree
registration flattens it into named graph inputs and outputs, so no model code is patched. The
example inputs are a *cached step*: the past comes from a real prefill run of the model, which also
tells the cache layout (layers, key/value heads, head dim, dtype) without reading any config field.
Names follow Optimum's (``past_key_values.{i}.key`` in, ``present.{i}.key`` out), interleaved per
layer as Optimum zips them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._transformers import CACHE_PARAMETERS, cache_parameter, output_cache
from ..errors import ConfigError, ExportError
from .config import ExportConfig, InputSpec
from .inputs import ExampleInputs, forward_parameters
from .parity import check_parity, flatten_outputs, runner_for

if TYPE_CHECKING:
    import torch
    from torch.utils._pytree import FlattenFn, FlattenWithKeysFn, KeyEntry, UnflattenFn
    from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

__all__ = [
    "WITH_PAST_SUFFIX",
    "cache_names",
    "GENERATION_CONFIG_FILE",
    "CacheInputs",
    "is_with_past",
    "is_encoder_decoder",
    "build_with_past_inputs",
    "check_with_past_config",
    "register_cache_pytree",
    "cache_layout",
    "encoder_decoder_leaves",
    "encoder_decoder_cache",
    "dynamic_cache",
    "dynamic_cache_leaves",
    "first_step_parity",
    "GenerationGraph",
    "GenerationFiles",
    "write_generation_files",
]

log = logging.getLogger(__name__)

WITH_PAST_SUFFIX = "-with-past"
GENERATION_CONFIG_FILE = "generation_config.json"
#: The graph's name for the past (Optimum's); forward() takes it as ``cache_parameter()`` says.
CACHE_ARG = "past_key_values"
#: Example cached step: batch, new tokens, past tokens (all > 1 so no axis is specialised).
BATCH, NEW, PAST = 2, 3, 5


def is_with_past(cfg: ExportConfig) -> bool:
    """Whether the export asks for a graph with a key/value cache."""
    return bool(cfg.task) and str(cfg.task).strip().lower().endswith(WITH_PAST_SUFFIX)


def is_encoder_decoder(module: torch.nn.Module) -> bool:
    """A transformers encoder-decoder model: its config says so and it hands out its encoder."""
    config = getattr(module, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and callable(
        getattr(module, "get_encoder", None)
    )


# ------------------------------------------------------------------------------------------- pytree
def _flatten(cache: Cache) -> tuple[list[torch.Tensor], int]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)], len(cache.layers)


def _flatten_with_keys(cache: Cache) -> tuple[list[tuple[KeyEntry, torch.Tensor]], int]:
    import torch.utils._pytree as pytree

    leaves, context = _flatten(cache)
    return [(pytree.SequenceKey(i), t) for i, t in enumerate(leaves)], context


def _unflatten(values: Iterable[torch.Tensor], context: int) -> DynamicCache:
    """Rebuild the cache with its layers already initialised (no empty-tensor constants in the graph)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    values = list(values)
    cache = DynamicCache()
    for i in range(int(context)):
        layer = DynamicLayer()
        layer.keys, layer.values = values[2 * i], values[2 * i + 1]
        layer.dtype, layer.device = layer.keys.dtype, layer.keys.device
        layer.is_initialized = True
        cache.layers.append(layer)
    return cache


def dynamic_cache_leaves(cache: Cache) -> list[torch.Tensor]:
    """A ``DynamicCache``'s tensors, per layer key then value (Optimum's order of ``present.{i}.*``)."""
    return _flatten(cache)[0]


def dynamic_cache(values: Iterable[torch.Tensor], layers: int) -> DynamicCache:
    """A ``DynamicCache`` of ``layers`` filled layers from :func:`dynamic_cache_leaves`' order."""
    return _unflatten(values, layers)


def encoder_decoder_leaves(cache: EncoderDecoderCache) -> tuple[list[torch.Tensor], int]:
    """An encoder-decoder cache, per layer as Optimum zips it: self-attention key, value, cross key, value."""
    own, cross = cache.self_attention_cache.layers, cache.cross_attention_cache.layers
    return [t for a, b in zip(own, cross, strict=True) for t in (a.keys, a.values, b.keys, b.values)], len(
        own
    )


def _pair_with_keys(cache: EncoderDecoderCache) -> tuple[list[tuple[KeyEntry, torch.Tensor]], int]:
    import torch.utils._pytree as pytree

    leaves, context = encoder_decoder_leaves(cache)
    return [(pytree.SequenceKey(i), t) for i, t in enumerate(leaves)], context


def encoder_decoder_cache(values: Iterable[torch.Tensor], context: int) -> EncoderDecoderCache:
    """Both caches rebuilt filled; the cross-attention one marked computed, so the graph reads it."""
    from transformers.cache_utils import EncoderDecoderCache

    values, layers = list(values), int(context)
    own = [t for i in range(layers) for t in values[4 * i : 4 * i + 2]]
    cross = [t for i in range(layers) for t in values[4 * i + 2 : 4 * i + 4]]
    cache = EncoderDecoderCache(_unflatten(own, layers), _unflatten(cross, layers))
    cache.is_updated = dict.fromkeys(range(layers), True)
    return cache


def _register(
    cls: type[Cache], flatten: FlattenFn, unflatten: UnflattenFn, with_keys: FlattenWithKeysFn
) -> None:
    import torch.utils._pytree as pytree

    current = pytree.SUPPORTED_NODES.get(cls)
    if current is not None and current.unflatten_fn is unflatten:
        return
    if current is not None:
        pytree._deregister_pytree_node(cls)
    pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__name__}",
        flatten_with_keys_fn=with_keys,
    )


def register_cache_pytree() -> None:
    """Register ``DynamicCache`` (per-layer key, value leaves) and ``EncoderDecoderCache`` (per-layer
    self-attention key, value, cross-attention key, value) with torch's pytree; idempotent.

    transformers' own registration (executorch integration) rebuilds layers through ``update()``,
    which puts empty-tensor constants into the graph that the ONNX exporter rejects, so ours replaces it.
    """
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    _register(DynamicCache, _flatten, _unflatten, _flatten_with_keys)
    _register(EncoderDecoderCache, encoder_decoder_leaves, encoder_decoder_cache, _pair_with_keys)


# -------------------------------------------------------------------------------------------- inputs
def cache_names(layers: int, base: str) -> list[str]:
    """Optimum's names, per layer key then value: ``past_key_values.{i}.key`` in, ``present.{i}.key`` out."""
    return [f"{base}.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


@dataclass
class CacheInputs(ExampleInputs):
    """Example inputs of a cached step; ``tensors`` holds the flat tensors under their graph names.

    forward() gets the past as a fresh cache object on every call (a forward pass grows it in place).
    """

    layers: int = 0
    cache_layout: dict[str, Any] = field(default_factory=dict)
    cache_arg: str = CACHE_ARG  # forward()'s own name for the cache (``cache`` on transformers 5)

    @property
    def past_names(self) -> list[str]:
        return cache_names(self.layers, "past_key_values")

    def forward_kwargs(self) -> dict[str, Any]:
        from transformers.cache_utils import DynamicCache

        past_names = set(self.past_names)
        past = [self.tensors[n] for n in self.past_names]
        kwargs: dict[str, Any] = {}
        for name in self.names:  # the specs' order: graph inputs follow the order forward() gets them in
            if name not in past_names:
                kwargs[name] = self.tensors[name]
            elif self.cache_arg not in kwargs:
                kwargs[self.cache_arg] = _unflatten(past, self.layers) if past else DynamicCache()
        kwargs["use_cache"] = True
        return kwargs

    def dynamo_shapes(self) -> dict[str, Any]:
        shapes = super().dynamo_shapes()
        past = [shapes[n] for n in self.past_names]
        return {k: past if k == self.cache_arg else shapes.get(k) for k in self.forward_kwargs()}

    def generation_record(self) -> dict[str, Any]:
        """What the runtime needs to drive the graph without model code (embedded in the metadata)."""
        return {
            "cache": self.cache_layout,
            "cache_inputs": self.past_names,
            "cache_outputs": list(self.output_names or ())[1:],
            "position_ids": "position_ids" in self.tensors,
        }


def _prefill(module: torch.nn.Module, ids: torch.Tensor, cache_arg: str) -> Cache:
    """A real prefill into a plain ``DynamicCache``: every layer keeps every position (the model's own cache
    trims sliding-window layers to the window, so layers would get different past lengths; the attention
    mask applies the window either way)."""
    import torch
    from transformers.cache_utils import DynamicCache

    with torch.no_grad():
        out = module(input_ids=ids, use_cache=True, **{cache_arg: DynamicCache()})
    cache = output_cache(out)
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        raise ExportError(
            f"{type(module).__name__} returned no key/value cache ({type(cache).__name__})",
            hint="with-past export needs a model whose forward(use_cache=True) returns a DynamicCache",
        )
    return cache


def cache_layout(cache: Cache) -> dict[str, Any]:
    """Layers, key/value heads, head dims and dtype of a filled ``DynamicCache``."""
    keys = [layer.keys for layer in cache.layers]
    first = keys[0]
    return {
        "layers": len(keys),
        "num_key_value_heads": int(first.shape[1]),
        "head_dim": int(first.shape[-1]),
        "value_head_dim": int(cache.layers[0].values.shape[-1]),
        "dtype": str(first.dtype).replace("torch.", ""),
        "shape": ["batch_size", "num_key_value_heads", "past_sequence_length", "head_dim"],
    }


def check_with_past_config(cfg: ExportConfig) -> None:
    """A with-past task needs the dynamo exporter (the cache is a pytree) and builds its own dynamic inputs."""
    if cfg.exporter != "dynamo":
        raise ConfigError(
            f"task {cfg.task} needs the dynamo exporter (the cache is a pytree), not {cfg.exporter}"
        )
    if cfg.input_specs or cfg.static_shapes:
        raise ConfigError(f"task {cfg.task} builds its own inputs and needs dynamic shapes")


def build_with_past_inputs(module: torch.nn.Module, cfg: ExportConfig) -> CacheInputs:
    """A cached step: ``NEW`` tokens after ``PAST`` tokens whose cache comes from a real prefill."""
    import torch

    check_with_past_config(cfg)
    params = [p.name for p in forward_parameters(module)]
    cache_arg = cache_parameter(params)
    if cache_arg is None or "input_ids" not in params:
        raise ConfigError(
            f"{type(module).__name__}.forward() takes no input_ids and no key/value cache"
            f" ({' or '.join(CACHE_PARAMETERS)}); cannot export {cfg.task}"
        )
    if is_encoder_decoder(module):
        raise ConfigError(
            f"{type(module).__name__} is an encoder-decoder; task {cfg.task} exports decoder-only models",
            hint="export it with --task text2text-generation-with-past (or automatic-speech-recognition-with-past)",
        )
    register_cache_pytree()
    vocab = int(getattr(getattr(module, "config", None), "vocab_size", None) or 100)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (BATCH, PAST + NEW), generator=gen)
    cache = _prefill(module, prompt[:, :PAST], cache_arg)
    layers = len(cache.layers)
    flat, _ = _flatten(cache)
    tensors: dict[str, Any] = {"input_ids": prompt[:, PAST:]}
    if "attention_mask" in params:
        tensors["attention_mask"] = torch.ones(BATCH, PAST + NEW, dtype=torch.int64)
    if "position_ids" in params:
        tensors["position_ids"] = torch.arange(PAST, PAST + NEW).expand(BATCH, NEW).contiguous()
    past_names = cache_names(layers, "past_key_values")
    tensors.update({n: t.detach().clone() for n, t in zip(past_names, flat, strict=True)})
    specs = _specs(tensors, past_names, vocab)
    order = [n for p in params for n in (past_names if p == cache_arg else [p]) if n in tensors]
    specs.sort(key=lambda s: order.index(s.name))  # graph inputs follow the flattened forward() arguments
    outputs = ("logits", *cache_names(layers, "present"))
    return CacheInputs(
        tuple(specs), tensors, outputs, layers=layers, cache_layout=cache_layout(cache), cache_arg=cache_arg
    )


def _specs(tensors: dict[str, torch.Tensor], past_names: list[str], vocab: int) -> list[InputSpec]:
    text = {0: "batch_size", 1: "sequence_length"}
    axes: dict[str, tuple[dict[int, str], tuple[float, float] | None]] = {
        "input_ids": (text, (0, vocab)),
        "attention_mask": ({0: "batch_size", 1: "past_sequence_length + sequence_length"}, (1, 2)),
        "position_ids": (text, None),
        **{n: ({0: "batch_size", 2: "past_sequence_length"}, None) for n in past_names},
    }
    return [
        InputSpec(n, tuple(t.shape), str(t.dtype).replace("torch.", ""), axes[n][0], axes[n][1])
        for n, t in tensors.items()
    ]


# ------------------------------------------------------------------------------------------- checks
def first_step_parity(
    inputs: CacheInputs, module: torch.nn.Module, tolerance: float, dtype: str, model: bytes | Path
) -> dict[str, Any]:
    """Parity of the first step (an empty, zero-length past) against PyTorch's prefill."""
    import torch

    ids = inputs.tensors["input_ids"]
    b, s = ids.shape
    layout = inputs.cache_layout
    feeds: dict[str, Any] = {"input_ids": ids}
    if "attention_mask" in inputs.tensors:
        feeds["attention_mask"] = torch.ones(b, s, dtype=torch.int64)
    if "position_ids" in inputs.tensors:
        feeds["position_ids"] = torch.arange(s).expand(b, s).contiguous()
    with torch.no_grad():
        reference = flatten_outputs(module(**feeds, use_cache=True))
    cache_dtype = getattr(torch, layout["dtype"])
    for name in inputs.past_names:
        dim = layout["head_dim"] if name.endswith(".key") else layout["value_head_dim"]
        feeds[name] = torch.zeros(b, layout["num_key_value_heads"], 0, dim, dtype=cache_dtype)
    numpy_feeds = {k: v.numpy() for k, v in feeds.items()}
    return check_parity(model, numpy_feeds, reference, tolerance, runner_for(dtype)).to_dict()


# ------------------------------------------------------------------------------------------ package
@runtime_checkable
class GenerationGraph(Protocol):
    """Example inputs of a graph that generation drives (:class:`CacheInputs`, a seq2seq or VLM step's)."""

    def generation_record(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GenerationFiles:
    """What the metadata says about a generation graph (its cache layout, the generation config), and
    ``generation_config.json`` when the model has a generation config."""

    record: dict[str, Any]
    config_file: str | None = None


def write_generation_files(
    inputs: GenerationGraph, module: torch.nn.Module, task: str | None, folder: Path
) -> GenerationFiles:
    """The generation record of the graph ``inputs`` describe; the model's generation config written into
    ``folder`` as ``generation_config.json``."""
    gen_config = getattr(module, "generation_config", None)
    record: dict[str, Any] = {"task": str(task), **inputs.generation_record()}
    if gen_config is None:
        return GenerationFiles(record)
    gen_config.to_json_file(str(folder / GENERATION_CONFIG_FILE), use_diff=True)
    record["generation_config"] = gen_config.to_diff_dict()
    return GenerationFiles(record, GENERATION_CONFIG_FILE)
