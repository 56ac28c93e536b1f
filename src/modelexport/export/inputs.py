"""Example inputs for export, from the model's ``forward`` signature and config.

Generators are registered by *input name* (``input_ids``, ``pixel_values``...), the convention
transformers uses across architectures, so no model names appear here. Plain ``nn.Module``s get
their shape from the first layer that consumes the input (Linear, Conv, Embedding, RNN...).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InputSpecError
from .config import ExportConfig, InputSpec

__all__ = ["ExampleInputs", "build_inputs", "forward_parameters"]

log = logging.getLogger(__name__)

BATCH, SEQ = 2, 16  # >1 so the exporters do not specialise dynamic axes to 1

_Generator = Callable[[Any, ExportConfig], InputSpec | None]
_INPUT_GENERATORS: dict[str, _Generator] = {}


def input_generator(*names: str) -> Callable[[_Generator], _Generator]:
    """Register how to build an example for the forward parameters called ``names``."""

    def deco(fn: _Generator) -> _Generator:
        for n in names:
            _INPUT_GENERATORS[n] = fn
        return fn

    return deco


def _text_shape(cfg: ExportConfig) -> tuple[int, int]:
    if cfg.input_shape and len(cfg.input_shape) == 2:
        return cfg.input_shape[0], cfg.input_shape[1]
    return BATCH, SEQ


def _vocab(config: Any) -> int:
    return int(getattr(config, "vocab_size", None) or 100)


@input_generator("input_ids", "decoder_input_ids")
def _ids(config: Any, cfg: ExportConfig) -> InputSpec:
    b, s = _text_shape(cfg)
    return InputSpec(
        "input_ids", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (0, _vocab(config))
    )


@input_generator("attention_mask", "decoder_attention_mask")
def _mask(config: Any, cfg: ExportConfig) -> InputSpec:
    b, s = _text_shape(cfg)
    return InputSpec("attention_mask", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (1, 2))


@input_generator("token_type_ids")
def _token_types(config: Any, cfg: ExportConfig) -> InputSpec | None:
    if not getattr(config, "type_vocab_size", 0):
        return None
    b, s = _text_shape(cfg)
    return InputSpec("token_type_ids", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (0, 1))


def _image_size(config: Any) -> int:
    size = getattr(config, "image_size", None) or 64
    return int(size[0] if isinstance(size, (list, tuple)) else size)


@input_generator("pixel_values")
def _pixels(config: Any, cfg: ExportConfig) -> InputSpec:
    if cfg.input_shape and len(cfg.input_shape) == 4:
        shape = cfg.input_shape
    else:
        size = _image_size(config)
        shape = (BATCH, int(getattr(config, "num_channels", 3) or 3), size, size)
    return InputSpec("pixel_values", tuple(shape), "float32", {0: "batch_size"})


@input_generator("input_values")
def _waveform(config: Any, cfg: ExportConfig) -> InputSpec:
    shape = cfg.input_shape if cfg.input_shape and len(cfg.input_shape) == 2 else (BATCH, 4000)
    return InputSpec("input_values", tuple(shape), "float32", {0: "batch_size", 1: "sequence_length"})


@input_generator("input_features")
def _features(config: Any, cfg: ExportConfig) -> InputSpec:
    mels = int(getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80))
    # Encoders with fixed positions (max_source_positions) need exactly 2x that many frames (stride-2 conv).
    frames = 2 * int(getattr(config, "max_source_positions", 0) or 0) or 100
    fixed = bool(getattr(config, "max_source_positions", 0))
    axes = {0: "batch_size"} if fixed else {0: "batch_size", 2: "num_frames"}
    return InputSpec("input_features", (BATCH, mels, frames), "float32", axes)


@dataclass
class ExampleInputs:
    """Concrete tensors plus the specs they came from (names, dynamic axes)."""

    specs: tuple[InputSpec, ...]
    tensors: dict[str, Any]  # name -> torch.Tensor
    #: Names for the graph outputs; None: named after the reference outputs.
    output_names: tuple[str, ...] | None = None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def dynamic_axes(self, static: bool) -> dict[str, dict[int, str]] | None:
        if static:
            return None
        axes = {s.name: dict(s.dynamic_axes) for s in self.specs if s.dynamic_axes}
        return axes or None

    def forward_kwargs(self) -> dict[str, Any]:
        """What forward() is called with (subclasses pack tensors into objects, e.g. a cache)."""
        return dict(self.tensors)

    def dynamo_shapes(self) -> dict[str, Any]:
        """``dynamic_shapes`` for ``torch.export``, keyed like :meth:`forward_kwargs`.

        Axis names, not ``Dim.DYNAMIC``: torch.onnx makes them dynamic and renames the graph's symbols
        (``s18``, ``s41``) to them, so the graph reads ``batch_size`` / ``sequence_length`` as Optimum writes.
        """
        axes = self.dynamic_axes(False) or {}
        return {name: {int(a): str(n) for a, n in axes.get(name, {}).items()} for name in self.tensors}

    def as_numpy(self) -> dict[str, Any]:
        return {k: v.detach().cpu().numpy() for k, v in self.tensors.items()}


def forward_parameters(module: Any) -> list[inspect.Parameter]:
    """``forward``'s parameters (without ``self``, ``*args``, ``**kwargs``)."""
    sig = inspect.signature(module.forward)
    return [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _make_tensor(spec: InputSpec, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    if spec.dtype == "bool":
        return torch.ones(spec.shape, dtype=torch.bool)
    if dtype.is_floating_point:
        t = torch.randn(spec.shape, generator=gen)
        if spec.range:
            lo, hi = spec.range
            t = torch.rand(spec.shape, generator=gen) * (hi - lo) + lo
        return t.to(dtype)
    lo, hi = spec.range or (0, 2)
    return torch.randint(int(lo), max(int(hi), int(lo) + 1), spec.shape, generator=gen, dtype=dtype)


def _hf_specs(module: Any, cfg: ExportConfig, params: list[str]) -> list[InputSpec]:
    config = module.config
    main = getattr(module, "main_input_name", None) or params[0]
    wanted = [main]
    for name in ("attention_mask", "token_type_ids"):
        if name in params and main == "input_ids":
            wanted.append(name)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        wanted.append("decoder_input_ids")
    specs = []
    for name in wanted:
        gen = _INPUT_GENERATORS.get(name)
        if gen is None:
            raise InputSpecError(f"no example generator for input {name!r}; give --input-specs")
        spec = gen(config, cfg)
        if spec is not None:
            specs.append(InputSpec(name, spec.shape, spec.dtype, spec.dynamic_axes, spec.range))
    return specs


#: First-layer type -> (input shape, dtype, dynamic axes, range) for plain nn.Modules.
def _first_layer_spec(module: Any, name: str) -> InputSpec | None:
    import torch.nn as nn

    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            return InputSpec(name, (BATCH, sub.in_features), "float32", {0: "batch_size"})
        if isinstance(sub, nn.Conv1d):
            return InputSpec(name, (BATCH, sub.in_channels, 32), "float32", {0: "batch_size"})
        if isinstance(sub, nn.Conv2d):
            return InputSpec(name, (BATCH, sub.in_channels, 32, 32), "float32", {0: "batch_size"})
        if isinstance(sub, nn.Conv3d):
            return InputSpec(name, (BATCH, sub.in_channels, 8, 16, 16), "float32", {0: "batch_size"})
        if isinstance(sub, nn.Embedding):
            return InputSpec(
                name, (BATCH, SEQ), "int64", {0: "batch_size", 1: "sequence_length"}, (0, sub.num_embeddings)
            )
        if isinstance(sub, nn.RNNBase):
            shape = (BATCH, 8, sub.input_size) if sub.batch_first else (8, BATCH, sub.input_size)
            return InputSpec(name, shape, "float32", {0 if sub.batch_first else 1: "batch_size"})
    return None


def _apply_shape_override(specs: list[InputSpec], cfg: ExportConfig) -> list[InputSpec]:
    if not cfg.input_shape or not specs:
        return specs
    first = specs[0]
    if len(cfg.input_shape) != len(first.shape):
        raise InputSpecError(
            f"--input-shape {list(cfg.input_shape)} has rank {len(cfg.input_shape)} but input {first.name!r} has rank {len(first.shape)}"
        )
    return [InputSpec(first.name, cfg.input_shape, first.dtype, first.dynamic_axes, first.range), *specs[1:]]


def _tokenize_text(text: str, tokenizer: Any, names: set[str]) -> dict[str, Any]:
    enc = tokenizer([text, text], return_tensors="pt")
    return {k: v for k, v in enc.items() if k in names}


def _check_against_signature(specs: tuple[InputSpec, ...], params: list[inspect.Parameter]) -> None:
    names = {p.name for p in params}
    unknown = [s.name for s in specs if s.name not in names]
    if unknown:
        raise InputSpecError(
            f"inputs {unknown} are not parameters of forward(); forward takes: {', '.join(p.name for p in params) or 'nothing'}"
        )
    given = {s.name for s in specs}
    missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in given]
    if missing:
        raise InputSpecError(f"forward() requires {missing} but the input specs do not give them")


def build_inputs(
    module: Any, cfg: ExportConfig, tokenizer: Any | None = None, seed: int = 0
) -> ExampleInputs:
    """Build example inputs: explicit specs win, then HF conventions, then the first layer's shape."""
    params = forward_parameters(module)
    names = [p.name for p in params]
    config = getattr(module, "config", None)
    if cfg.input_specs:
        specs = list(cfg.input_specs)
    elif config is not None and hasattr(config, "to_dict"):
        specs = _apply_shape_override(_hf_specs(module, cfg, names), cfg)
    else:
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        if len(required) != 1:
            raise InputSpecError(
                f"cannot guess example inputs for forward({', '.join(names)}); give --input-specs FILE.json"
            )
        spec = _first_layer_spec(module, required[0])
        if spec is None:
            raise InputSpecError(
                f"cannot infer the shape of input {required[0]!r} of {type(module).__name__}; give --input-specs FILE.json"
            )
        specs = _apply_shape_override([spec], cfg)
    _check_against_signature(tuple(specs), params)
    specs.sort(key=lambda s: names.index(s.name))  # graph inputs follow forward()'s order in both exporters
    tensors = {s.name: _make_tensor(s, seed + i) for i, s in enumerate(specs)}
    if cfg.text is not None:
        if tokenizer is None:
            raise InputSpecError("--text needs a model with a tokenizer (a Hugging Face text model folder)")
        tokens = _tokenize_text(cfg.text, tokenizer, set(tensors))
        for k, v in tokens.items():
            tensors[k] = v
        specs = [
            InputSpec(s.name, tuple(tensors[s.name].shape), s.dtype, s.dynamic_axes, s.range) for s in specs
        ]
    return ExampleInputs(tuple(specs), tensors)
