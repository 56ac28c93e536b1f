"""``genai_config.json``: the file onnxruntime-genai reads to run a package's decoder, so that the same tagged
graph runs in our pipelines and in onnxruntime-genai.

onnxruntime-genai drives one decoder graph through the names its config gives (``decoder.inputs`` /
``decoder.outputs``, the cache as ``%d`` name templates), with its own loop: it feeds ``input_ids``, an
``attention_mask`` over past + new tokens and ``position_ids`` when the graph takes them (both of the graph's
integer type), an empty ``[batch, kv_heads, 0, head_size]`` past on the first step, and each step's
``present.*`` as the next past. Those are our decoder's semantics, so the config describes the graph as it is:
nothing is renamed. It is written only for a graph that onnxruntime-genai can run that way (checked here on
the graph's inputs and outputs); :attr:`GenaiConfig.reason` says why another gets none.

``model.type`` is ``decoder``: onnxruntime-genai's generic decoder-only type (its ``DecoderOnly_Model``, the
class it also runs ``llama``, ``qwen2``, ``phi3``... with), so no architecture name is mapped; the types it
handles otherwise (``gpt2``'s older cache layout, vision and speech models) describe graphs ours are not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import read_json_object, write_json
from ..errors import MetadataError
from .build import graph_io

if TYPE_CHECKING:
    import onnx
    from transformers import GenerationConfig, PretrainedConfig

__all__ = [
    "GENAI_CONFIG_FILE",
    "GENAI_MODEL_TYPE",
    "GenaiConfig",
    "build_genai_config",
    "genai_config_mismatch",
    "retarget_genai_config",
]

GENAI_CONFIG_FILE = "genai_config.json"
#: onnxruntime-genai's generic decoder-only model type (``ModelType::IsLLM``).
GENAI_MODEL_TYPE = "decoder"
#: The token inputs onnxruntime-genai feeds a decoder, by its config key (our graph names them the same).
_TOKEN_INPUTS = ("input_ids", "attention_mask", "position_ids")
#: The integer types onnxruntime-genai feeds ``attention_mask`` and ``position_ids`` in.
_INDEX_TYPES = ("int32", "int64")
#: The cache types its key/value cache handles.
_CACHE_TYPES = ("float32", "float16")
#: onnxruntime-genai's search options that a transformers generation config holds under the same name.
_SEARCH_KEYS = {
    "do_sample": bool,
    "num_beams": int,
    "num_return_sequences": int,
    "min_length": int,
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "repetition_penalty": float,
    "no_repeat_ngram_size": int,
    "length_penalty": float,
}


@dataclass(frozen=True)
class GenaiConfig:
    """The content of ``genai_config.json``, or (``config`` None) why the graph gets none."""

    config: dict[str, Any] | None
    reason: str = ""


def _template(names: Sequence[str]) -> str | None:
    """The ``%d`` template whose layer ``i`` is ``names[i]`` (``past_key_values.%d.key``); None when the names
    follow none."""
    templates = {re.sub(rf"(?<!\d){i}(?!\d)", "%d", name, count=1) for i, name in enumerate(names)}
    template = templates.pop() if len(templates) == 1 else ""
    return template if "%d" in template else None


def _why_not_runnable(model: onnx.ModelProto, record: Mapping[str, Any]) -> str | None:
    """Why onnxruntime-genai's decoder loop cannot drive the graph (None: it can): the graph must take only
    the inputs it feeds and return only logits and the present, a cache of one head size in a type it
    keeps."""
    inputs, outputs = graph_io(model)
    cache_in, cache_out = list(record.get("cache_inputs") or ()), list(record.get("cache_outputs") or ())
    layout = record.get("cache") or {}
    if not cache_in or len(cache_in) != len(cache_out) or len(cache_in) != 2 * int(layout.get("layers", 0)):
        return "the graph has no per-layer key/value cache (past in, present out)"
    if layout.get("head_dim") != layout.get("value_head_dim", layout.get("head_dim")):
        return "keys and values have different head sizes; onnxruntime-genai has one head_size"
    if layout.get("dtype") not in _CACHE_TYPES:
        return f"the cache is {layout.get('dtype')}; onnxruntime-genai keeps float32 or float16"
    types = {v["name"]: v["dtype"] for v in inputs}
    extra = [n for n in types if n not in (*_TOKEN_INPUTS, *cache_in)]
    if extra:
        fed = ", ".join(_TOKEN_INPUTS)
        return f"inputs {', '.join(extra)}: onnxruntime-genai feeds a decoder only {fed} and the past"
    if "input_ids" not in types or any(n not in types for n in cache_in):
        return "the graph takes no input_ids or not its whole past (onnxruntime-genai feeds both)"
    index_types = {types[n] for n in _TOKEN_INPUTS[1:] if n in types}
    if len(index_types) > 1 or not index_types <= set(_INDEX_TYPES):
        return "attention_mask and position_ids must share one type, int32 or int64"
    out_names = [v["name"] for v in outputs]
    if out_names != ["logits", *cache_out]:
        return f"outputs {', '.join(out_names)}: onnxruntime-genai reads logits and the present"
    if None in (_template(cache_in[0::2]), _template(cache_in[1::2])):
        return f"the cache names ({', '.join(cache_in[:2])}, ...) follow no per-layer pattern"
    if None in (_template(cache_out[0::2]), _template(cache_out[1::2])):
        return f"the present names ({', '.join(cache_out[:2])}, ...) follow no per-layer pattern"
    return None


def _decoder_io(model: onnx.ModelProto, record: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """``decoder.inputs`` / ``decoder.outputs`` naming the graph's own inputs and outputs (of a runnable
    graph)."""
    names = {v["name"] for v in graph_io(model)[0]}
    cache_in, cache_out = list(record["cache_inputs"]), list(record["cache_outputs"])
    decoder_in = {n: n for n in _TOKEN_INPUTS if n in names}
    decoder_in["past_key_names"] = str(_template(cache_in[0::2]))
    decoder_in["past_value_names"] = str(_template(cache_in[1::2]))
    decoder_out = {
        "logits": "logits",
        "present_key_names": str(_template(cache_out[0::2])),
        "present_value_names": str(_template(cache_out[1::2])),
    }
    return decoder_in, decoder_out


def _token_ids(
    model_config: PretrainedConfig | None, generation_config: GenerationConfig | None
) -> dict[str, Any]:
    """bos / eos / pad as onnxruntime-genai wants them: the generation config's, else the model config's;
    eos a list; no pad: the first eos (what its model builder does)."""

    def pick(key: str) -> Any:
        for source in (generation_config, model_config):
            value = getattr(source, key, None)
            if value is not None:
                return value
        return None

    eos = pick("eos_token_id")
    eos = [int(e) for e in eos] if isinstance(eos, list | tuple) else [] if eos is None else [int(eos)]
    ids: dict[str, Any] = {"eos_token_id": eos}
    pad, bos = pick("pad_token_id"), pick("bos_token_id")
    if pad is None and eos:
        pad = eos[0]
    ids.update({k: int(v) for k, v in (("pad_token_id", pad), ("bos_token_id", bos)) if v is not None})
    return ids


def _search(generation_config: GenerationConfig | None, context_length: int) -> dict[str, Any]:
    """onnxruntime-genai's search defaults from the generation config. ``past_present_share_buffer`` is off:
    an exported graph returns the past and the new tokens concatenated, not written into a buffer of
    max_length (:func:`retarget_genai_config` turns it on for a graph that does)."""
    search: dict[str, Any] = {"max_length": context_length, "past_present_share_buffer": False}
    for key, kind in _SEARCH_KEYS.items():
        value = getattr(generation_config, key, None)
        if isinstance(value, bool | int | float):
            search[key] = kind(value)
    return search


def _int_field(config: PretrainedConfig | None, key: str) -> int | None:
    value = getattr(config, key, None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def build_genai_config(
    model: onnx.ModelProto,
    record: Mapping[str, Any],
    filename: str,
    model_config: PretrainedConfig | None,
    generation_config: GenerationConfig | None,
) -> GenaiConfig:
    """The ``genai_config.json`` of the decoder ``model`` (its generation ``record``: cache layout and names),
    to be written beside ``filename``; the sizes come from the graph's cache, the context length, widths and
    token ids from the model's configs."""
    reason = _why_not_runnable(model, record)
    if reason:
        return GenaiConfig(None, reason)
    decoder_in, decoder_out = _decoder_io(model, record)
    context_length = _int_field(model_config, "max_position_embeddings")
    if not context_length:
        return GenaiConfig(
            None, "the model config has no max_position_embeddings (onnxruntime-genai's context_length)"
        )
    layout = record["cache"]
    decoder: dict[str, Any] = {
        "filename": filename,
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "head_size": int(layout["head_dim"]),
        "num_key_value_heads": int(layout["num_key_value_heads"]),
        "num_hidden_layers": int(layout["layers"]),
        "inputs": decoder_in,
        "outputs": decoder_out,
    }
    for key in ("hidden_size", "num_attention_heads"):  # informational for a decoder-only model
        value = _int_field(model_config, key)
        if value:
            decoder[key] = value
    section: dict[str, Any] = {"type": GENAI_MODEL_TYPE, "context_length": context_length, "decoder": decoder}
    vocab = _int_field(model_config, "vocab_size")
    if vocab:
        section["vocab_size"] = vocab
    section.update(_token_ids(model_config, generation_config))
    return GenaiConfig({"model": section, "search": _search(generation_config, context_length)})


def genai_config_mismatch(config: Mapping[str, Any], model: onnx.ModelProto) -> str | None:
    """What in ``config``'s decoder names is not in ``model``'s inputs and outputs (None: every name is)."""
    decoder = config.get("model", {}).get("decoder", {})
    layers = int(decoder.get("num_hidden_layers", 0))
    inputs, outputs = ({v["name"] for v in side} for side in graph_io(model))
    wanted: list[tuple[str, set[str]]] = []
    for names, present in ((decoder.get("inputs", {}), inputs), (decoder.get("outputs", {}), outputs)):
        for value in names.values():
            expanded = [value % i for i in range(layers)] if "%d" in value else [value]
            wanted += [(n, present) for n in expanded]
    missing = [n for n, present in wanted if n not in present]
    return f"the graph has no {', '.join(missing)}" if missing else None


def retarget_genai_config(
    path: Path, model: onnx.ModelProto, filename: str, shared_buffer: bool = False
) -> str | None:
    """Make a copied ``genai_config.json`` name ``filename`` (a transformed graph ``model``) as its decoder;
    ``shared_buffer``: the graph writes new positions into a past buffer of max_length bound as its present
    too (``GroupQueryAttention``), so onnxruntime-genai's ``past_present_share_buffer`` is on. None when
    done, else why the copy no longer fits ``model`` (the caller drops it)."""
    config = read_json_object(path, MetadataError, hint=f"re-export the model to write a fresh {path.name}")
    mismatch = genai_config_mismatch(config, model)
    if mismatch:
        return mismatch
    config["model"]["decoder"]["filename"] = filename
    config.setdefault("search", {})["past_present_share_buffer"] = shared_buffer
    write_json(path, config)
    return None
