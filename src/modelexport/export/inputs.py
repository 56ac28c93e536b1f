"""Example inputs for export, from the model's ``forward`` signature and config.

Generators are registered by *input name* (``input_ids``, ``pixel_values``...), the convention
transformers uses across architectures, so no model names appear here. Plain ``nn.Module``s get
their shape from the first layer that consumes the input (Linear, Conv, Embedding, RNN...).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._registry import Registry
from ..errors import InputSpecError, first_line
from .config import ExportConfig, InputSpec

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

__all__ = [
    "ExampleInputs",
    "OtherSize",
    "build_inputs",
    "forward_parameters",
    "hf_example",
    "input_specs_hint",
    "modality_config",
    "tensor_to_numpy",
]

log = logging.getLogger(__name__)

BATCH, SEQ = 2, 16  # >1 so the exporters do not specialise dynamic axes to 1

_Generator = Callable[["PretrainedConfig", ExportConfig], InputSpec | None]


@dataclass(frozen=True)
class _InputGenerator:
    """How to build an example for one forward parameter, and what the export needs to know about it."""

    build: _Generator
    #: A multimodal config keeps each modality's settings in ``<modality>_config``.
    modality: str
    #: {axis: name} of the axes a model may leave free (an image's height and width): each export finds out
    #: whether the model takes another size there (:mod:`.free_axes`) and keeps them fixed if not.
    free_axes: dict[int, str] = field(default_factory=dict)


#: input name -> its generator (names that share one are aliases).
_INPUT_GENERATORS: Registry[_InputGenerator] = Registry("example input", error=InputSpecError)
#: The inputs that carry a modality's data (the others, masks and type ids, go with them).
_PRIMARY = ("input_ids", "pixel_values", "input_values", "input_features")


def input_generator(
    *names: str, modality: str, free_axes: dict[int, str] | None = None
) -> Callable[[_Generator], _Generator]:
    """Register how to build an example for the forward parameters called ``names``; ``free_axes`` are
    the axes tried dynamic where the model allows it (named as Optimum names them)."""

    return _INPUT_GENERATORS.register_as(
        names[0], lambda fn: _InputGenerator(fn, modality, dict(free_axes or {})), *names[1:]
    )


def modality_config(config: PretrainedConfig | None, name: str) -> PretrainedConfig | None:
    """The sub-config of ``name``'s modality (``text_config``...), or None for single-modality configs."""
    gen = _INPUT_GENERATORS.find(name)
    sub = getattr(config, f"{gen.modality if gen else ''}_config", None)
    return sub if hasattr(sub, "to_dict") else None


def _text_shape(cfg: ExportConfig) -> tuple[int, int]:
    if cfg.input_shape and len(cfg.input_shape) == 2:
        return cfg.input_shape[0], cfg.input_shape[1]
    return BATCH, SEQ


def _vocab(config: PretrainedConfig) -> int:
    return int(getattr(config, "vocab_size", None) or 100)


@input_generator("input_ids", "decoder_input_ids", modality="text")
def _ids(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec:
    b, s = _text_shape(cfg)
    return InputSpec(
        "input_ids", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (0, _vocab(config))
    )


@input_generator("attention_mask", "decoder_attention_mask", modality="text")
def _mask(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec:
    b, s = _text_shape(cfg)
    return InputSpec("attention_mask", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (1, 2))


@input_generator("token_type_ids", modality="text")
def _token_types(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec | None:
    if not getattr(config, "type_vocab_size", 0):
        return None
    b, s = _text_shape(cfg)
    return InputSpec("token_type_ids", (b, s), "int64", {0: "batch_size", 1: "sequence_length"}, (0, 1))


def _image_size(config: PretrainedConfig) -> int:
    size = getattr(config, "image_size", None) or 64
    return int(size[0] if isinstance(size, (list, tuple)) else size)


@input_generator("pixel_values", modality="vision", free_axes={2: "height", 3: "width"})
def _pixels(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec:
    """Batch dynamic; height/width too where the model takes another size (decided per export). The
    channels stay a number: the first convolution's weights fix them."""
    if cfg.input_shape and len(cfg.input_shape) == 4:
        shape = cfg.input_shape
    else:
        size = _image_size(config)
        shape = (BATCH, int(getattr(config, "num_channels", 3) or 3), size, size)
    return InputSpec("pixel_values", tuple(shape), "float32", {0: "batch_size"})


@input_generator("input_values", modality="audio")
def _waveform(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec:
    """A raw waveform (batch, samples), or a spectrogram (batch, max_length frames, num_mel_bins) when
    the config gives mel bins: such encoders patch a fixed-size spectrogram, so only batch is dynamic."""
    mels, frames = getattr(config, "num_mel_bins", None), getattr(config, "max_length", None)
    if mels and frames:
        shape = cfg.input_shape if cfg.input_shape and len(cfg.input_shape) == 3 else (BATCH, frames, mels)
        return InputSpec("input_values", tuple(shape), "float32", {0: "batch_size"})
    shape = cfg.input_shape if cfg.input_shape and len(cfg.input_shape) == 2 else (BATCH, 4000)
    return InputSpec("input_values", tuple(shape), "float32", {0: "batch_size", 1: "sequence_length"})


@input_generator("input_features", modality="audio")
def _features(config: PretrainedConfig, cfg: ExportConfig) -> InputSpec:
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
    tensors: dict[str, torch.Tensor]  # by ONNX input name
    #: Names for the graph outputs; None: named after the reference outputs.
    output_names: tuple[str, ...] | None = None
    #: forward() parameter each spec feeds (None: the spec names are the parameter names)
    params: tuple[str, ...] | None = None
    #: input name -> {axis: name}: axes to try free (an image's height/width), not yet in the specs; empty
    #: once decided (:meth:`fixed`) or for inputs the user specified.
    free_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    #: Set while the free axes are tried (:meth:`trying`): the inputs at another size and PyTorch's outputs
    #: there, which the captured graph must reproduce.
    other_size: OtherSize | None = None

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def parameters(self) -> list[str]:
        return list(self.params) if self.params else self.names

    def dynamic_axes(self, static: bool) -> dict[str, dict[int, str]] | None:
        if static:
            return None
        axes = {s.name: dict(s.dynamic_axes) for s in self.specs if s.dynamic_axes}
        return axes or None

    def forward_kwargs(self) -> dict[str, Any]:
        """What forward() is called with: the tensors keyed by the parameter each feeds (subclasses pack
        tensors into objects, e.g. a cache)."""
        return {p: self.tensors[n] for p, n in zip(self.parameters, self.names, strict=True)}

    def dynamo_shapes(self) -> dict[str, Any]:
        """``dynamic_shapes`` for ``torch.export``, keyed like :meth:`forward_kwargs`.

        Axis names, not ``Dim.DYNAMIC``: torch.onnx makes them dynamic and renames the graph's symbols
        (``s18``, ``s41``) to them, so the graph reads ``batch_size`` / ``sequence_length`` as Optimum writes.
        """
        axes = self.dynamic_axes(False) or {}
        return {
            param: {int(a): str(n) for a, n in axes.get(name, {}).items()}
            for param, name in zip(self.parameters, self.names, strict=True)
        }

    def export_shapes(self) -> dict[str, Any]:
        """``dynamic_shapes`` for ``torch.export.export`` while free axes are tried: the named axes
        ``Dim.DYNAMIC``, the free ones ``Dim.AUTO`` (torch keeps them symbolic only where the code allows)."""
        import torch

        dims = torch.export.Dim
        return {
            param: {
                int(a): dims.AUTO if int(a) in self.free_axes.get(name, {}) else dims.DYNAMIC
                for a in self._axes_of(name)
            }
            for param, name in zip(self.parameters, self.names, strict=True)
        }

    def axis_names(self) -> dict[str, dict[int, str]]:
        """Input name -> {axis: name} of every dynamic axis, the free ones being tried included."""
        return {s.name: self._axes_of(s.name) for s in self.specs if self._axes_of(s.name)}

    def _axes_of(self, name: str) -> dict[int, str]:
        return dict((self.dynamic_axes(False) or {}).get(name, {}))

    def trying(self, other: OtherSize) -> ExampleInputs:
        """These inputs with the free axes dynamic in the specs, checked at ``other``'s size."""
        specs = tuple(
            replace(s, dynamic_axes={**(s.dynamic_axes or {}), **self.free_axes[s.name]})
            if s.name in self.free_axes
            else s
            for s in self.specs
        )
        return replace(self, specs=specs, other_size=other)

    def fixed(self) -> ExampleInputs:
        """These inputs with every free axis fixed at the example's size (as every export did before)."""
        specs = tuple(
            replace(s, dynamic_axes={a: n for a, n in s.dynamic_axes.items() if a not in free})
            if (free := self.free_axes.get(s.name)) and s.dynamic_axes
            else s
            for s in self.specs
        )
        return replace(self, specs=specs, free_axes={}, other_size=None)

    def resized(self, shapes: dict[str, tuple[int, ...]], seed: int = 1) -> dict[str, Any]:
        """The tensors with the inputs named in ``shapes`` drawn anew at that shape (same rule, dtype and
        device as the example's); the others as they are."""
        specs = {s.name: s for s in self.specs}
        out = dict(self.tensors)
        for i, (name, shape) in enumerate(shapes.items()):
            old = self.tensors[name]
            out[name] = _make_tensor(replace(specs[name], shape=tuple(shape)), seed + i).to(
                old.device, old.dtype
            )
        return out

    def as_numpy(self) -> dict[str, Any]:
        return {k: tensor_to_numpy(v) for k, v in self.tensors.items()}

    @contextlib.contextmanager
    def bind(self, module: torch.nn.Module) -> Iterator[None]:
        """While the graph is captured and checked: what ``module`` runs. Its own ``forward`` here;
        inputs of one step of a multi-graph export put that step in its place."""
        yield


@dataclass(frozen=True)
class OtherSize:
    """The example inputs at another height/width and PyTorch's outputs there: what a graph whose free
    axes are dynamic must reproduce."""

    tensors: dict[str, Any]  # every input by graph name, the resized ones drawn anew
    kwargs: dict[str, Any]  # the same, as forward() takes them
    reference: list[tuple[str, Any]]
    shapes: dict[str, tuple[int, ...]]  # the resized inputs' shapes
    axes: str  # what is tried free, e.g. "height/width"
    atol: float
    scaled: bool = False
    #: CPU seconds torch.export may take with the axes free (None: no limit, once it has succeeded).
    export_budget_s: float | None = None

    @property
    def label(self) -> str:
        """The other size, e.g. ``40x48``."""
        return ", ".join("x".join(str(d) for d in shape[2:]) for shape in self.shapes.values())

    def feeds(self) -> dict[str, Any]:
        return {k: tensor_to_numpy(v) for k, v in self.tensors.items()}

    def mismatch(self, run: Callable[[], list[Any]], what: str) -> str | None:
        """Why ``run()`` (``what`` at this size: torch.export's graph, the ONNX graph) does not give
        PyTorch's outputs here, or None."""
        try:
            got = list(run())
        except Exception as exc:  # noqa: BLE001 - any failure at the other size means the size is fixed
            return f"{what} fails at {self.label} ({type(exc).__name__}: {first_line(exc)})"
        want = [t for _, t in self.reference]
        if [tuple(g.shape) for g in got] != [tuple(w.shape) for w in want]:
            return f"{what} gives other output shapes than PyTorch at {self.label}"
        worst = max(
            (_excess(g, w, self.atol, self.scaled) for g, w in zip(got, want, strict=True)), default=0.0
        )
        return f"{what} differs from PyTorch at {self.label} by {worst:.3g}" if worst > 0 else None


def _excess(
    got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray, atol: float, scaled: bool
) -> float:
    """How far beyond the bound ``got`` is from ``want`` (0 when within), the bound as parity sets it."""
    import numpy as np

    g, w = (np.asarray(tensor_to_numpy(t) if hasattr(t, "detach") else t, np.float64) for t in (got, want))
    if not w.size:
        return 0.0
    diff = float(np.abs(g - w).max())
    bound = atol * max(1.0, float(np.abs(w).max())) if scaled else atol
    return diff if diff > bound else 0.0


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A torch tensor as a numpy array on the CPU; bfloat16 (which numpy lacks) as ``ml_dtypes.bfloat16``,
    the type ONNX's own tools use."""
    import torch

    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


def forward_parameters(module: torch.nn.Module) -> list[inspect.Parameter]:
    """``forward``'s parameters (without ``self``, ``*args``, ``**kwargs``)."""
    sig = inspect.signature(module.forward)
    return [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def input_specs_hint(module: torch.nn.Module, tried: tuple[InputSpec, ...] | list[InputSpec] = ()) -> str:
    """An ``--input-specs`` example built from ``forward``'s real parameters: the inputs tried (with
    their shapes), else the required parameters (shapes to fill in)."""
    params = forward_parameters(module)
    by_name = {s.name: s for s in tried}
    chosen = [p for p in params if p.name in by_name] or [
        p for p in params if p.default is inspect.Parameter.empty
    ]
    entries = [
        {"name": s.name, "shape": list(s.shape), "dtype": s.dtype}
        if (s := by_name.get(p.name))
        else {"name": p.name, "shape": "SHAPE", "dtype": "float32"}
        for p in chosen or params[:1]
    ]
    takes = ", ".join(p.name for p in params) or "nothing"
    return (
        f"{type(module).__name__}.forward({takes}): give its inputs with --input-specs FILE.json, "
        f"e.g. {json.dumps({'inputs': entries})}"
    )


def _make_tensor(spec: InputSpec, seed: int) -> torch.Tensor:
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


def _wanted_inputs(module: torch.nn.Module, params: list[str]) -> list[str]:
    """The main input; for multimodal configs (a sub-config per modality) every modality's main
    input forward takes; text masks and type ids with text; the decoder's ids for encoder-decoders."""
    config = module.config
    main = getattr(module, "main_input_name", None) or params[0]
    wanted = [main]
    wanted += [n for n in _PRIMARY if n != main and n in params and modality_config(config, n) is not None]
    if "input_ids" in wanted:
        wanted += [n for n in ("attention_mask", "token_type_ids") if n in params]
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        wanted.append("decoder_input_ids")
    return wanted


def _spec_for(config: PretrainedConfig, name: str, cfg: ExportConfig) -> InputSpec | None:
    gen = _INPUT_GENERATORS.find(name)
    if gen is None:
        raise InputSpecError(f"no example generator for input {name!r}; give --input-specs")
    spec = gen.build(modality_config(config, name) or config, cfg)
    return None if spec is None else InputSpec(name, spec.shape, spec.dtype, spec.dynamic_axes, spec.range)


def _hf_specs(module: torch.nn.Module, cfg: ExportConfig, params: list[str]) -> list[InputSpec]:
    specs = [_spec_for(module.config, name, cfg) for name in _wanted_inputs(module, params)]
    return [s for s in specs if s is not None]


def hf_example(
    config: PretrainedConfig, names: list[str], cfg: ExportConfig, seed: int = 0
) -> tuple[list[InputSpec], dict[str, torch.Tensor]]:
    """Specs and seeded tensors for the named transformers inputs (e.g. an encoder's own inputs)."""
    specs = [s for s in (_spec_for(config, n, cfg) for n in names) if s is not None]
    return specs, {s.name: _make_tensor(s, seed + i) for i, s in enumerate(specs)}


#: First-layer type -> (input shape, dtype, dynamic axes, range) for plain nn.Modules.
def _first_layer_spec(module: torch.nn.Module, name: str) -> InputSpec | None:
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


def _tokenize_text(text: str, tokenizer: PreTrainedTokenizerBase, names: set[str]) -> dict[str, torch.Tensor]:
    enc = tokenizer([text, text], return_tensors="pt")
    return {k: v for k, v in enc.items() if k in names}


def _parameters_for(
    specs: list[InputSpec], params: list[inspect.Parameter], module: torch.nn.Module
) -> list[str]:
    """The forward() parameter each spec feeds: by name when every name is a parameter, else by
    position, as ``torch.onnx.export``'s ``input_names`` (the spec names stay the ONNX input names)."""
    names = [p.name for p in params]
    if all(s.name in names for s in specs):
        return [s.name for s in specs]
    positional = [p.name for p in params if p.kind != inspect.Parameter.KEYWORD_ONLY]
    clash = [s.name for i, s in enumerate(specs) if s.name in names and positional[i : i + 1] != [s.name]]
    if len(specs) > len(positional) or clash:
        raise InputSpecError(
            f"inputs {[s.name for s in specs if s.name not in names]} are not parameters of forward(), and "
            f"cannot map by position: forward takes {', '.join(names) or 'nothing'}",
            hint=input_specs_hint(module, specs),
        )
    return positional[: len(specs)]


def _check_against_signature(
    given: list[str], params: list[inspect.Parameter], module: torch.nn.Module
) -> None:
    missing = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in given]
    if missing:
        raise InputSpecError(
            f"forward() requires {missing} but the input specs do not give them",
            hint=input_specs_hint(module),
        )


def _with_default_axes(spec: InputSpec) -> InputSpec:
    """A user spec that does not say ``dynamic_axes`` gets a dynamic batch axis (axis 0); ``{}`` is static."""
    if spec.dynamic_axes is not None or not spec.shape:
        return spec
    return InputSpec(spec.name, spec.shape, spec.dtype, {0: "batch_size"}, spec.range)


def build_inputs(
    module: torch.nn.Module,
    cfg: ExportConfig,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
) -> ExampleInputs:
    """Build example inputs: explicit specs win, then HF conventions, then the first layer's shape."""
    params = forward_parameters(module)
    names = [p.name for p in params]
    config = getattr(module, "config", None)
    if cfg.input_specs:
        specs = [_with_default_axes(s) for s in cfg.input_specs]
    elif config is not None and hasattr(config, "to_dict"):
        specs = _apply_shape_override(_hf_specs(module, cfg, names), cfg)
    else:
        required = [p.name for p in params if p.default is inspect.Parameter.empty]
        if len(required) != 1:
            raise InputSpecError(
                f"cannot guess example inputs for forward({', '.join(names)}); give --input-specs FILE.json",
                hint=input_specs_hint(module),
            )
        spec = _first_layer_spec(module, required[0])
        if spec is None:
            raise InputSpecError(
                f"cannot infer the shape of input {required[0]!r} of {type(module).__name__}; give --input-specs FILE.json",
                hint=input_specs_hint(module),
            )
        specs = _apply_shape_override([spec], cfg)
    fed = _parameters_for(specs, params, module)
    _check_against_signature(fed, params, module)
    order = sorted(range(len(specs)), key=lambda i: names.index(fed[i]))  # graph inputs follow forward()
    specs, fed = [specs[i] for i in order], [fed[i] for i in order]
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
    params_fed = tuple(fed) if fed != [s.name for s in specs] else None
    free = {} if cfg.input_specs else _free_axes(specs)
    return ExampleInputs(tuple(specs), tensors, params=params_fed, free_axes=free)


def _free_axes(specs: list[InputSpec]) -> dict[str, dict[int, str]]:
    """The registered free axes of the generated specs (user-given specs keep exactly what they say)."""
    return {
        s.name: dict(gen.free_axes)
        for s in specs
        if (gen := _INPUT_GENERATORS.find(s.name)) and gen.free_axes and max(gen.free_axes) < len(s.shape)
    }
