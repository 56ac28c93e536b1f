"""Encoder-decoder generation export (``text2text-generation-with-past``, ``automatic-speech-recognition-with-past``).

Three graphs in one folder, with Optimum's file, input and output names, so ``ORTModelForSeq2SeqLM`` /
``ORTModelForSpeechSeq2Seq`` load the folder:

- ``encoder_model.onnx``: the encoder's main input (``input_ids`` + ``attention_mask``, or ``input_features``)
  -> ``last_hidden_state``;
- ``decoder_model.onnx``, the first step: ``input_ids``, ``encoder_attention_mask`` (text), ``encoder_hidden_states``
  -> ``logits``, ``present.{i}.decoder.key/value``, ``present.{i}.encoder.key/value``;
- ``decoder_with_past_model.onnx``, every later step: the same inputs plus ``past_key_values.{i}.decoder.*`` and
  ``past_key_values.{i}.encoder.*`` -> ``logits``, ``present.{i}.decoder.key/value`` (the cross-attention
  cache does not change after the first step).

Every graph is captured from the whole model, calling it the generic transformers seq2seq way
(``get_encoder()``, ``encoder_outputs``, ``decoder_input_ids``, ``past_key_values``): a step function stands in
for ``forward`` while the graph is captured and checked (:meth:`StepInputs.bind`), so the tags of each graph
are paths of the same module tree and no model code is patched. The past is transformers'
``EncoderDecoderCache``, flattened by our pytree registration (:func:`.generation.register_cache_pytree`);
its layout comes from a real first step of the model.

``--optimize`` and ``--quantize dynamic`` run on each graph (:mod:`..optimize.export_pass`); static
quantization is refused: its ranges would come from one random decoder step (see :func:`check_seq2seq_config`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from .._transformers import cache_parameter, output_cache
from ..errors import ConfigError, ExportError
from ..metadata.tasks import normalize_task
from .config import ExportConfig, InputSpec
from .generation import (
    BATCH,
    CACHE_ARG,
    NEW,
    PAST,
    cache_layout,
    check_with_past_config,
    encoder_decoder_cache,
    encoder_decoder_leaves,
    is_encoder_decoder,
    is_with_past,
    register_cache_pytree,
)
from .inputs import hf_example
from .steps import StepFn, StepInputs

if TYPE_CHECKING:
    import torch
    from transformers.cache_utils import EncoderDecoderCache
    from transformers.utils import ModelOutput

__all__ = [
    "ENCODER_FILE",
    "DECODER_FILE",
    "DECODER_WITH_PAST_FILE",
    "SEQ2SEQ_FILES",
    "SEQ2SEQ_UNSUPPORTED_OPTIONS",
    "refuse_graph_set_options",
    "SEQ2SEQ_TASKS",
    "check_seq2seq_config",
    "is_seq2seq_task",
    "build_seq2seq_inputs",
]

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
DECODER_WITH_PAST_FILE = "decoder_with_past_model.onnx"
#: The package's graphs, in the order they run.
SEQ2SEQ_FILES = (ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE)
#: The pipelines whose ``-with-past`` export is an encoder-decoder package.
SEQ2SEQ_TASKS = ("text2text-generation", "automatic-speech-recognition")
#: Export options that report on or dump one graph; not offered for three graphs yet.
SEQ2SEQ_UNSUPPORTED_OPTIONS = ("fx_graph", "jit_graph", "with_report")
_ENCODER_AXES = {0: "batch_size", 1: "encoder_sequence_length"}
#: The sequence axis of a cache input, by side: the decoder's own past grows, the encoder's is its length.
_PAST_AXIS = {"decoder": "past_decoder_sequence_length", "encoder": "encoder_sequence_length"}


def is_seq2seq_task(cfg: ExportConfig) -> bool:
    """A ``*-with-past`` task of an encoder-decoder pipeline (three graphs)."""
    return is_with_past(cfg) and normalize_task(str(cfg.task)) in SEQ2SEQ_TASKS


def _kv_names(base: str, layers: int, sides: tuple[str, ...]) -> list[str]:
    """Optimum's names, per layer: ``{base}.{i}.decoder.key``, ``.decoder.value``, ``.encoder.key``, ..."""
    return [f"{base}.{i}.{side}.{kind}" for i in range(layers) for side in sides for kind in ("key", "value")]


# -------------------------------------------------------------------------------------------- steps


def _encoder_step(call: StepFn, module: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    return module.get_encoder()(**inputs, return_dict=True).last_hidden_state


def _decoder_outputs(out: ModelOutput, with_past: bool) -> tuple[torch.Tensor, ...]:
    cache = output_cache(out)
    if with_past:  # the cross-attention cache is an input and stays as it is
        own = cache.self_attention_cache.layers
        return (out.logits, *(t for layer in own for t in (layer.keys, layer.values)))
    return (out.logits, *encoder_decoder_leaves(cache)[0])


def _decoder_call(
    call: StepFn,
    input_ids: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor | None = None,
    past_key_values: EncoderDecoderCache | None = None,
) -> ModelOutput:
    cache_arg = cache_parameter(inspect.signature(call).parameters) or CACHE_ARG
    kwargs: dict[str, Any] = {
        "decoder_input_ids": input_ids,
        "encoder_outputs": (encoder_hidden_states,),
        cache_arg: past_key_values,
        "use_cache": True,
        "return_dict": True,
    }
    if encoder_attention_mask is not None:
        kwargs["attention_mask"] = encoder_attention_mask
    return call(**kwargs)


def _first_step(call: StepFn, module: torch.nn.Module, **inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return _decoder_outputs(_decoder_call(call, **inputs), with_past=False)


def _past_step(
    call: StepFn, module: torch.nn.Module, **inputs: torch.Tensor | EncoderDecoderCache
) -> tuple[torch.Tensor, ...]:
    return _decoder_outputs(_decoder_call(call, **inputs), with_past=True)


# ------------------------------------------------------------------------------------------- inputs
def check_seq2seq_config(cfg: ExportConfig) -> None:
    """The options an encoder-decoder export refuses, checked before the model loads."""
    check_with_past_config(cfg)
    refuse_graph_set_options(
        cfg,
        [],
        "export without it",
        "a decoder's activation ranges depend on the step, the past length and the encoder output, and the "
        "export has one random example of each",
        "int8 weights, activation ranges computed at run time: no calibration",
    )


def refuse_graph_set_options(
    cfg: ExportConfig, given: list[str], plain: str, static_why: str, dynamic_what: str
) -> None:
    """What an export of several graphs (encoder-decoder, vision-language) refuses: the single-graph options
    (plus ``given``, the caller's own), and ``--quantize static`` (``static_why``: one example per graph
    cannot calibrate it)."""
    given = [o for o in SEQ2SEQ_UNSUPPORTED_OPTIONS if getattr(cfg, o) not in (None, False, "none")] + given
    if given:
        raise ConfigError(
            f"task {cfg.task} writes three graphs; {', '.join(given)} is not supported for it yet",
            hint=f"{plain}; --optimize and --quantize dynamic run on every graph",
        )
    if cfg.quantize == "static":
        raise ConfigError(
            f"task {cfg.task}: --quantize static is refused; {static_why}",
            hint=f"use --quantize dynamic ({dynamic_what})",
        )


def _check(module: torch.nn.Module, cfg: ExportConfig) -> None:
    check_seq2seq_config(cfg)
    if not is_encoder_decoder(module):
        raise ConfigError(
            f"task {cfg.task} needs an encoder-decoder model (config.is_encoder_decoder and get_encoder()); "
            f"{type(module).__name__} is not one",
            hint="decoder-only models export with --task text-generation-with-past",
        )


def _spec(
    name: str, tensor: torch.Tensor, axes: dict[int, str], value_range: tuple[float, float] | None = None
) -> InputSpec:
    return InputSpec(name, tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""), axes, value_range)


def _encoder_inputs(
    module: torch.nn.Module, cfg: ExportConfig
) -> tuple[list[InputSpec], dict[str, torch.Tensor]]:
    """The encoder's main input; text encoders also take their ``attention_mask`` (Optimum's encoder inputs)."""
    main = str(getattr(module, "main_input_name", "input_ids"))
    names = [main, "attention_mask"] if main == "input_ids" else [main]
    specs, tensors = hf_example(module.config, names, cfg)
    if main == "input_ids":  # Optimum's axis name: the decoder's inputs share it
        specs = [_spec(s.name, tensors[s.name], _ENCODER_AXES, s.range) for s in specs]
    return specs, tensors


def _first_step_run(
    module: torch.nn.Module, ids: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None
) -> EncoderDecoderCache:
    """A real first decoder step: its cache gives the past of the cached-step example and the layout."""
    import torch

    with torch.no_grad():
        out = _decoder_call(module.forward, ids, hidden, mask)
    cache = output_cache(out)
    if not hasattr(cache, "self_attention_cache") or not cache.self_attention_cache.layers:
        raise ExportError(
            f"{type(module).__name__} returned no encoder-decoder cache ({type(cache).__name__})",
            hint="with-past export of an encoder-decoder needs forward(use_cache=True) to return an EncoderDecoderCache",
        )
    return cache


def _record(module: torch.nn.Module, main: str, cache: EncoderDecoderCache, layers: int) -> dict[str, Any]:
    cross = {**cache_layout(cache.cross_attention_cache)}
    cross["shape"] = ["batch_size", "num_key_value_heads", "encoder_sequence_length", "head_dim"]
    return {
        "components": {
            "encoder": ENCODER_FILE,
            "decoder": DECODER_FILE,
            "decoder_with_past": DECODER_WITH_PAST_FILE,
        },
        "encoder_input": main,
        "cache": cache_layout(cache.self_attention_cache),
        "cross_attention_cache": cross,
        "cache_inputs": _kv_names(CACHE_ARG, layers, ("decoder", "encoder")),
        "cache_outputs": _kv_names("present", layers, ("decoder",)),
        "first_step_cache_outputs": _kv_names("present", layers, ("decoder", "encoder")),
        "decoder_start_token_id": getattr(module.config, "decoder_start_token_id", None),
    }


def build_seq2seq_inputs(module: torch.nn.Module, cfg: ExportConfig) -> list[StepInputs]:
    """The example inputs of the encoder, the first decoder step and a cached decoder step, in that order."""
    import torch

    _check(module, cfg)
    register_cache_pytree()
    enc_specs, enc = _encoder_inputs(module, cfg)
    with torch.no_grad():
        hidden = module.get_encoder()(**enc, return_dict=True).last_hidden_state
    mask = enc.get("attention_mask")
    vocab = int(getattr(module.config, "vocab_size", None) or 100)
    ids = torch.randint(0, vocab, (BATCH, PAST + NEW), generator=torch.Generator().manual_seed(1))
    cache = _first_step_run(module, ids[:, :PAST], hidden, mask)
    layers = len(cache.self_attention_cache.layers)
    record = _record(module, enc_specs[0].name, cache, layers)
    shared = {"encoder_hidden_states": (hidden, _ENCODER_AXES, None)}
    if mask is not None:
        shared["encoder_attention_mask"] = (mask, _ENCODER_AXES, (1, 2))
    decoder_ids = {"input_ids": (ids[:, PAST:], {0: "batch_size", 1: "decoder_sequence_length"}, (0, vocab))}
    past = {
        name: (t.detach().clone(), {0: "batch_size", 2: _PAST_AXIS[name.split(".")[2]]}, None)
        for name, t in zip(record["cache_inputs"], encoder_decoder_leaves(cache)[0], strict=True)
    }
    first = {**decoder_ids, **shared}
    return [
        StepInputs(
            tuple(enc_specs),
            enc,
            ("last_hidden_state",),
            file=ENCODER_FILE,
            step=_encoder_step,
            record=record,
        ),
        _step(
            first, ("logits", *record["first_step_cache_outputs"]), DECODER_FILE, _first_step, layers, record
        ),
        _step(
            {**first, **past},
            ("logits", *record["cache_outputs"]),
            DECODER_WITH_PAST_FILE,
            _past_step,
            layers,
            record,
        ),
    ]


def _step(
    entries: dict[str, tuple[torch.Tensor, dict[int, str], tuple[float, float] | None]],
    outputs: tuple[str, ...],
    file: str,
    step: StepFn,
    layers: int,
    record: dict[str, Any],
) -> StepInputs:
    specs = tuple(_spec(n, t, axes, rng) for n, (t, axes, rng) in entries.items())
    tensors = {n: t for n, (t, _, _) in entries.items()}
    return StepInputs(
        specs,
        tensors,
        outputs,
        file=file,
        step=step,
        layers=layers,
        record=record,
        cache_from=encoder_decoder_cache,
    )
