"""Text generation on ONNX Runtime: greedy, sampling (temperature, top-k, top-p), beam search, repetition
penalty, stop on EOS or length; prompts batched with left padding.

With a ``*-with-past`` graph the key/value cache stays in ONNX Runtime's memory: each step feeds the
previous step's ``present.*`` OrtValues as the next ``past_key_values.*`` (the prompt through IO binding,
a one-token step on the CPU through one ``run_with_ort_values`` call), and only the logits come back to
numpy. A graph without a cache is run on the whole sequence at every step.
The decoding rules follow transformers' ``generate`` (same processor order, same padding of finished rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..._io import read_json_object
from ..._numeric import softmax
from ...errors import ConfigError, InferenceError, MetadataError
from ...metadata.schema import CACHE_INPUT_PREFIX, KEY_GENERATION
from ..processors import BaseONNXProcessor
from ..processors.text import Tokenizer
from .base import ONNXPipeline, register_pipeline

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, NodeArg, OrtValue

__all__ = [
    "GenerationSettings",
    "TextGenerationPipeline",
    "process_scores",
    "run_bound",
    "device_of",
    "position_ids",
]

_CUDA = "CUDAExecutionProvider"
#: The feeds whose second axis is the step's new tokens (a decoder's ids, or a VLM decoder's embeddings).
_TOKEN_FEEDS = ("input_ids", "inputs_embeds")
#: transformers' GenerationConfig defaults of the options a pipeline may override.
_TRANSFORMERS_DEFAULTS: dict[str, Any] = {"num_beams": 1, "max_new_tokens": None}


@dataclass(frozen=True)
class GenerationSettings:
    """How to pick the next tokens; ranges are checked before any work starts."""

    max_new_tokens: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_beams: int = 1
    seed: int | None = None
    #: Never generated (transformers' ``suppress_tokens``); ids outside the vocabulary are ignored, as there.
    suppress_tokens: tuple[int, ...] = ()
    #: Not generated as the first new token (``begin_suppress_tokens``: Whisper's blank and EOS).
    begin_suppress_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            object.__setattr__(self, name, tuple(int(t) for t in getattr(self, name) or ()))
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.num_beams < 1:
            raise ConfigError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.num_beams > 1 and self.do_sample:
            raise ConfigError("beam search with sampling is not supported; use num_beams=1 with do_sample")


def _suppress(scores: np.ndarray, tokens: tuple[int, ...]) -> None:
    ids = [t for t in tokens if 0 <= t < scores.shape[-1]]
    if ids:
        scores[:, ids] = -np.inf


def process_scores(
    scores: np.ndarray, sequences: np.ndarray, s: GenerationSettings, first: bool = False
) -> np.ndarray:
    """transformers' order: suppressed tokens (``first``: the first new token also drops
    ``begin_suppress_tokens``), repetition penalty, then (sampling only) temperature, top-k, top-p.
    Greedy decoding without suppression or penalty returns the scores as they are (no copy per step)."""
    suppressed = s.suppress_tokens + (s.begin_suppress_tokens if first else ())
    if not (suppressed or s.repetition_penalty != 1.0 or s.do_sample):
        return scores.astype(np.float32, copy=False)
    scores = scores.astype(np.float32, copy=True)
    _suppress(scores, suppressed)
    if s.repetition_penalty != 1.0:
        rows = np.arange(len(scores))[:, None]
        seen = scores[rows, sequences]
        scores[rows, sequences] = np.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
    if not s.do_sample:
        return scores
    scores /= s.temperature
    if s.top_k is not None and s.top_k < scores.shape[-1]:
        kth = np.partition(scores, -s.top_k, axis=-1)[:, -s.top_k][:, None]
        scores[scores < kth] = -np.inf
    if s.top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as transformers
        sorted_scores = np.take_along_axis(scores, order, axis=-1)
        cumulative = np.cumsum(softmax(sorted_scores), axis=-1)
        remove = cumulative <= 1 - s.top_p
        remove[:, -1] = False  # keep at least one token
        np.put_along_axis(scores, order, np.where(remove, -np.inf, sorted_scores), axis=-1)
    return scores


def position_ids(mask: np.ndarray) -> np.ndarray:
    """Each token's position in a left-padded batch, as transformers' ``generate`` computes it: the count of
    real tokens before it; padding positions get 1."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos[mask == 0] = 1
    return pos


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def device_of(session: InferenceSession) -> str:
    """Where a session's outputs live: the cache stays there between steps."""
    providers = session.get_providers()
    return "cuda" if providers and providers[0] == _CUDA else "cpu"


class _Cache:
    """The graph's cache inputs/outputs and the OrtValues carried between steps."""

    def __init__(self, session: InferenceSession, record: dict[str, Any]) -> None:
        import onnxruntime as ort

        self.ort = ort
        inputs = {i.name: i for i in session.get_inputs()}
        self.in_names = list(
            record.get("cache_inputs") or [n for n in inputs if n.startswith(CACHE_INPUT_PREFIX)]
        )
        outputs = [o.name for o in session.get_outputs()]
        self.out_names = list(record.get("cache_outputs") or [n for n in outputs if n.startswith("present.")])
        layout = record.get("cache") or {}
        self.heads = layout.get("num_key_value_heads") or self._dim(inputs, 1)
        self.key_dim = layout.get("head_dim") or self._dim(inputs, 3)
        self.value_dim = layout.get("value_head_dim") or self.key_dim
        self.dtype = np.dtype(layout.get("dtype", "float32"))
        self.device = device_of(session)
        #: One buffer per layer serves as past and present (the graph writes each step's positions into it:
        #: ``GroupQueryAttention``, :mod:`modelexport.optimize.group_query`); on the CPU only.
        self.shared = bool(layout.get("shared_buffer")) and self.device == "cpu"

    def _dim(self, inputs: dict[str, NodeArg], axis: int) -> int:
        value = inputs[self.in_names[0]].shape[axis]
        if not isinstance(value, int):
            raise InferenceError(f"cache input {self.in_names[0]!r} has no fixed size on axis {axis}")
        return value

    def empty(self, batch: int) -> list[OrtValue]:
        """Zero-length past for the first step."""
        return [
            self.ort.OrtValue.ortvalue_from_numpy(
                np.zeros(
                    (batch, self.heads, 0, self.key_dim if n.endswith(".key") else self.value_dim), self.dtype
                )
            )
            for n in self.in_names
        ]


class _SharedCache:
    """A decoding's cache as one zeroed buffer per cache input, ``room`` positions long, bound through one IO
    binding as the layer's past and as its present: each step the graph writes only its new positions, where
    a concatenating graph copies the whole cache into a new present (issue 26). A step past the room moves
    the cache into buffers twice as long (a large ``max_new_tokens`` reserves nothing up front); row order
    follows beams (:meth:`reorder`)."""

    #: Positions reserved past the prompt at the start (more as the generation needs them).
    INITIAL_NEW = 512

    def __init__(self, session: InferenceSession, cache: _Cache, batch: int, room: int) -> None:
        self.cache = cache
        self.buffers = [
            np.zeros(
                (batch, cache.heads, room, cache.key_dim if n.endswith(".key") else cache.value_dim),
                cache.dtype,
            )
            for n in cache.in_names
        ]
        self.binding = session.io_binding()
        self._bind_cache()
        self.session, self.first = session, session.get_outputs()[0].name
        self.logits: dict[tuple[int, ...], np.ndarray] = {}
        self.bound: tuple[int, ...] = ()

    def _bind_cache(self) -> None:
        names = zip(self.cache.in_names, self.cache.out_names, self.buffers, strict=True)
        for past, present, buffer in names:
            value = self.cache.ort.OrtValue.ortvalue_from_numpy(buffer)  # shares the array's memory
            self.binding.bind_ortvalue_input(past, value)
            self.binding.bind_ortvalue_output(present, value)

    def _grow(self, length: int) -> None:
        """Buffers of at least ``length`` positions (twice the room), the cache so far copied in."""
        room = self.buffers[0].shape[2]
        if length <= room:
            return
        wider = []
        for buffer in self.buffers:
            shape = list(buffer.shape)
            shape[2] = max(length, 2 * room)
            grown = np.zeros(shape, buffer.dtype)
            grown[:, :, :room] = buffer
            wider.append(grown)
        self.buffers = wider
        self._bind_cache()

    def run(self, feeds: dict[str, np.ndarray], vocab: int) -> np.ndarray:
        """One step: ``feeds`` bound (the arrays are read in place), the logits written into a buffer of ours;
        returns the last position's."""
        shape = (*feeds[next(k for k in _TOKEN_FEEDS if k in feeds)].shape[:2], vocab)
        mask = feeds.get("attention_mask")
        self._grow(mask.shape[1] if mask is not None else 0)
        logits = self.logits.get(shape)
        if logits is None:
            logits = self.logits[shape] = np.empty(shape, np.float32)
        try:
            if shape != self.bound:  # the prompt's, then one token's: bound when the shape changes
                self.binding.bind_output(self.first, "cpu", 0, np.float32, list(shape), logits.ctypes.data)
                self.bound = shape
            for name, value in feeds.items():
                self.binding.bind_cpu_input(name, value)
            self.session.run_with_iobinding(self.binding)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
            raise _failed(feeds, exc) from exc
        return logits[:, -1, :]

    def reorder(self, order: np.ndarray) -> _SharedCache:
        """The rows following the beams that survived, in place (the binding keeps pointing at them)."""
        for buffer in self.buffers:
            buffer[:] = buffer[order]
        return self


def _failed(feeds: dict[str, np.ndarray], exc: Exception) -> InferenceError:
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    return InferenceError(f"ONNX Runtime failed on inputs {shapes}: {type(exc).__name__}: {exc}")


def run_bound(
    session: InferenceSession,
    feeds: dict[str, np.ndarray],
    values: dict[str, OrtValue],
    cache_outputs: list[str],
    device: str = "cpu",
    logits: np.ndarray | None = None,
) -> tuple[np.ndarray, list[OrtValue]]:
    """One step through IO binding: numpy ``feeds`` and OrtValue ``values`` (a cache, encoder states) in;
    the first output's last position to numpy, the ``cache_outputs`` kept as OrtValues on ``device``.

    ``logits``: an empty float32 array of the first output's shape that ONNX Runtime writes into (no
    allocation by ONNX Runtime and no copy out of it: the prompt's logits are 15 MB for 128 tokens of a
    30k vocabulary).

    A step of one new token on the CPU goes through ``run_with_ort_values`` instead: one call that takes
    the feeds and returns every output, where IO binding costs a Python call per cache tensor in and out
    (issue 26: 0.3 against 0.1 ms per step outside ONNX Runtime for 24 cache tensors); its logits, one
    position per row, are copied out (120 KB a row for a 30k vocabulary)."""
    if _one_token_on_cpu(feeds, device):
        return _run_values(session, feeds, values, cache_outputs)
    try:
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        first = session.get_outputs()[0].name
        if logits is None:
            binding.bind_output(first, "cpu")
        else:
            binding.bind_output(first, "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        for name in cache_outputs:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
        raise _failed(feeds, exc) from exc
    scores = outputs[0].numpy() if logits is None else logits
    return scores[:, -1, :], list(outputs[1:])


def _one_token_on_cpu(feeds: dict[str, np.ndarray], device: str) -> bool:
    """Whether :func:`run_bound` takes its ``run_with_ort_values`` path (one new token, the CPU), which
    needs no ``logits`` buffer."""
    return device == "cpu" and [feeds[k].shape[1] for k in _TOKEN_FEEDS if k in feeds] == [1]


def _run_values(
    session: InferenceSession,
    feeds: dict[str, np.ndarray],
    values: dict[str, OrtValue],
    cache_outputs: list[str],
) -> tuple[np.ndarray, list[OrtValue]]:
    """:func:`run_bound`'s CPU step in one ``run_with_ort_values`` call (numpy feeds wrapped, not copied)."""
    import onnxruntime as ort

    inputs = dict(values)
    try:
        for name, value in feeds.items():
            inputs[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
        outputs = session.run_with_ort_values([session.get_outputs()[0].name, *cache_outputs], inputs)
        scores = outputs[0].numpy()
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
        raise _failed(feeds, exc) from exc
    return scores[:, -1, :], list(outputs[1:])


@register_pipeline("text-generation")
class TextGenerationPipeline(ONNXPipeline):
    """``[{"generated_text": prompt + continuation}]`` per prompt, like transformers' text-generation pipeline."""

    processor_kinds = ("tokenizer",)
    generates = True
    #: Defaults of transformers' pipeline for this task where the model's generation config sets none.
    pipeline_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, session: InferenceSession, processor: BaseONNXProcessor, **kwargs: object) -> None:
        """``kwargs``: :class:`ONNXPipeline`'s (metadata, model_path, batch_size...)."""
        super().__init__(session, processor, **kwargs)
        # the processor's tokenizer encodes and decodes: FastTokenizer (the tokenizers library alone: no
        # transformers or torch import, a start in a fraction of a second) where the folder allows it
        self.record: dict[str, Any] = dict(self.metadata.get(KEY_GENERATION) or {})
        self.generation_config = self._generation_config()
        names = [i.name for i in session.get_inputs()]
        self.cache = (
            _Cache(session, self.record) if any(n.startswith(CACHE_INPUT_PREFIX) for n in names) else None
        )
        self.input_names = names
        self.vocab = self._bound_vocab(session)

    def _bound_vocab(self, session: InferenceSession) -> int | None:
        """The logits' last size when ONNX Runtime can write them into an array of ours (float32, fixed)."""
        out = session.get_outputs()[0]
        size = out.shape[-1] if out.shape else None
        return size if out.type == "tensor(float)" and isinstance(size, int) and len(out.shape) == 3 else None

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that encodes prompts and decodes the generated ids (``FastTokenizer`` or transformers')."""
        return self.processor.tokenizer

    # ------------------------------------------------------------------------------------------ config
    def _generation_config(self) -> dict[str, Any]:
        """generation_config.json beside the model, else the embedded copy, else the model config's ids.

        The file is read as it is (not through ``transformers.GenerationConfig``, which drops the fields it
        does not know when the file says ``_from_model_config``: Whisper's ``lang_to_id``, ``task_to_id``...).
        """
        folder = Path(self.model_path).parent if self.model_path else None
        if folder is not None and (folder / "generation_config.json").is_file():
            return read_json_object(
                folder / "generation_config.json", MetadataError, hint="fix or remove generation_config.json"
            )
        if self.record.get("generation_config"):
            return dict(self.record["generation_config"])
        return {k: self.model_config.get(k) for k in ("eos_token_id", "pad_token_id", "bos_token_id")}

    def settings(self, **kwargs: object) -> GenerationSettings:
        """The call's options over the generation config's, over the pipeline's defaults (as transformers'
        pipelines: a model config left at transformers' default takes the pipeline's value)."""
        given = {k: v for k, v in kwargs.items() if v is not None}
        g = dict(self.generation_config)
        for key, value in self.pipeline_defaults.items():
            if key == "num_beams" and given.get("do_sample"):
                continue  # beam sampling is not offered: a sampling call keeps the model's beams
            if g.get(key) in (None, _TRANSFORMERS_DEFAULTS.get(key)):
                g[key] = value
        base = GenerationSettings(
            max_new_tokens=int(g.get("max_new_tokens") or 20),
            do_sample=bool(g.get("do_sample") or False),
            temperature=float(g.get("temperature") or 1.0),
            top_k=int(g.get("top_k", 50)) or None,  # transformers' default: 50 best tokens when sampling
            top_p=float(g.get("top_p") or 1.0),
            repetition_penalty=float(g.get("repetition_penalty") or 1.0),
            num_beams=int(g.get("num_beams") or 1),
            suppress_tokens=tuple(int(t) for t in g.get("suppress_tokens") or ()),
            begin_suppress_tokens=tuple(int(t) for t in g.get("begin_suppress_tokens") or ()),
        )
        unknown = set(given) - set(GenerationSettings.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown generation options {sorted(unknown)}")
        return replace(base, **given)

    @property
    def eos_ids(self) -> set[int]:
        eos = self.generation_config.get("eos_token_id")
        return set() if eos is None else {int(e) for e in (eos if isinstance(eos, list) else [eos])}

    @property
    def pad_id(self) -> int:
        pad = self.generation_config.get("pad_token_id")
        if pad is None:
            pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = min(self.eos_ids, default=0)
        return int(pad)

    # --------------------------------------------------------------------------------------- encoding
    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded ids and attention mask."""
        tok = self.tokenizer
        side, pad = tok.padding_side, tok.pad_token
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        try:
            enc = tok(texts, padding=True, return_tensors="np")
        finally:
            tok.padding_side, tok.pad_token = side, pad
        return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)

    # ---------------------------------------------------------------------------------------- running
    def _step_feeds(self, ids: np.ndarray, mask: np.ndarray, new: int) -> dict[str, np.ndarray]:
        feeds = {"input_ids": np.ascontiguousarray(ids[:, -new:])}
        if "attention_mask" in self.input_names:
            feeds["attention_mask"] = mask
        if "position_ids" in self.input_names:
            feeds["position_ids"] = np.ascontiguousarray(position_ids(mask)[:, -new:])
        return feeds

    def _run(
        self, feeds: dict[str, np.ndarray], past: list[OrtValue] | None
    ) -> tuple[np.ndarray, list[OrtValue]]:
        """One forward pass; returns the last position's logits and the new cache OrtValues."""
        if self.cache is None:
            try:
                logits = self.session.run([self.output_names[0]], feeds)[0]
            except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types; re-raised typed
                raise _failed(feeds, exc) from exc
            return logits[:, -1, :], []
        if isinstance(past, _SharedCache):
            return past.run(feeds, int(self.vocab)), past
        bound = dict(zip(self.cache.in_names, past or [], strict=True))
        ids = feeds["input_ids"]
        buffered = self.vocab and not _one_token_on_cpu(feeds, self.cache.device)
        logits = np.empty((*ids.shape, self.vocab), np.float32) if buffered else None
        return run_bound(self.session, feeds, bound, self.cache.out_names, self.cache.device, logits)

    # --------------------------------------------------------------------- decoding steps (subclasses)
    # The decoding state is each subclass's own (here the cache OrtValues or a _SharedCache, None without a
    # cache; an encoder-decoder's holds its encoder states too): generate() only hands it from one step to the
    # next, so these three hooks type it Any and each override names its own.
    def _begin(
        self, ids: np.ndarray, mask: np.ndarray, context: dict[str, np.ndarray] | None, room: int = 0
    ) -> Any:
        """The state before the first step (here: an empty past, or, for a graph that writes into its past, a
        shared buffer for the ``room`` positions the prompt and its new tokens take, at most
        :attr:`_SharedCache.INITIAL_NEW` new ones up front); ``context`` is what generate() was given."""
        if self.cache is not None and self.cache.shared and self.vocab and room:
            room = min(room, ids.shape[1] + _SharedCache.INITIAL_NEW)
            return _SharedCache(self.session, self.cache, len(ids), room)
        return self.cache.empty(len(ids)) if self.cache else None

    def _advance(self, ids: np.ndarray, mask: np.ndarray, new: int, past: Any) -> tuple[np.ndarray, Any]:
        """One step on the last ``new`` tokens: the next-token scores and the new state."""
        return self._run(self._step_feeds(ids, mask, new), past)

    def _reorder(self, past: Any, order: np.ndarray) -> Any:
        """The state with its rows following the beams that survived."""
        if isinstance(past, _SharedCache):
            return past.reorder(order)
        return [self.cache.ort.OrtValue.ortvalue_from_numpy(p.numpy()[order]) for p in past] if past else past

    @property
    def incremental(self) -> bool:
        """Whether a step after the first feeds only the new token (the graph keeps a cache)."""
        return self.cache is not None

    def generate(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        settings: GenerationSettings,
        streamer: Callable[[np.ndarray], None] | None = None,
        context: dict[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Token ids (prompt + new tokens) for left-padded ``input_ids``; ``streamer`` gets each step's tokens.

        ``context`` goes to :meth:`_begin` (an encoder-decoder hands its encoder's output over here).
        """
        if settings.num_beams > 1:
            return self._beam_search(input_ids, attention_mask, settings, context)
        rng = np.random.default_rng(settings.seed)
        ids, mask = input_ids.astype(np.int64), attention_mask.astype(np.int64)
        past = self._begin(ids, mask, context, room=ids.shape[1] + settings.max_new_tokens)
        unfinished = np.ones(len(ids), dtype=bool)
        new = ids.shape[1]
        eos, pad = np.array(sorted(self.eos_ids), np.int64), self.pad_id  # read once, not per token
        for step in range(settings.max_new_tokens):
            scores, past = self._advance(ids, mask, new, past)
            scores = process_scores(scores, ids, settings, first=step == 0)
            if settings.do_sample:
                probs = softmax(scores)
                tokens = np.array([rng.choice(len(p), p=p / p.sum()) for p in probs], dtype=np.int64)
            else:
                tokens = scores.argmax(-1).astype(np.int64)
            tokens = np.where(unfinished, tokens, pad)
            ids = np.concatenate([ids, tokens[:, None]], axis=1)
            mask = np.concatenate([mask, np.ones((len(ids), 1), np.int64)], axis=1)
            if streamer is not None:
                streamer(tokens)
            unfinished &= ~(tokens[:, None] == eos).any(axis=1)
            if not unfinished.any():
                break
            new = 1 if self.incremental else ids.shape[1]
        return ids

    def _select_beams(
        self,
        flat: np.ndarray,
        ids: np.ndarray,
        beam_scores: np.ndarray,
        done: list[list[tuple[float, np.ndarray]]],
        generated: int,
    ) -> tuple[list[int], list[int]]:
        """Per prompt, the best ``beams`` continuations of the 2*beams candidates; those ending in EOS are
        finished hypotheses (scored by their generated length) and do not continue."""
        batch, beams = beam_scores.shape
        vocab = flat.shape[1] // beams
        rows: list[int] = []
        tokens: list[int] = []
        for b in range(batch):
            chosen = 0
            for idx in np.argsort(-flat[b], kind="stable")[: 2 * beams]:
                beam, token = divmod(int(idx), vocab)
                row, score = b * beams + beam, float(flat[b, idx])
                if token in self.eos_ids:
                    done[b].append((score / generated, np.append(ids[row], token)))
                    continue
                rows.append(row)
                tokens.append(token)
                beam_scores[b, chosen] = score
                chosen += 1
                if chosen == beams:
                    break
        return rows, tokens

    def _beam_search(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        s: GenerationSettings,
        context: dict[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Beam search with transformers' length-normalised scores; the cache rows follow their beams."""
        beams, batch, length = s.num_beams, len(input_ids), input_ids.shape[1]
        ids = np.repeat(input_ids.astype(np.int64), beams, axis=0)
        mask = np.repeat(attention_mask.astype(np.int64), beams, axis=0)
        past = self._begin(ids, mask, context, room=length + s.max_new_tokens)
        beam_scores = np.zeros((batch, beams), np.float32)
        beam_scores[:, 1:] = -1e9  # the first step expands from one beam
        done: list[list[tuple[float, np.ndarray]]] = [[] for _ in range(batch)]
        new = length
        for step in range(s.max_new_tokens):
            scores, past = self._advance(ids, mask, new, past)
            logp = _log_softmax(process_scores(scores, ids, s, first=step == 0)) + beam_scores.reshape(-1, 1)
            vocab = logp.shape[-1]
            flat = logp.reshape(batch, beams * vocab)
            rows, tokens = self._select_beams(flat, ids, beam_scores, done, step + 1)
            order = np.array(rows)
            ids = np.concatenate([ids[order], np.array(tokens, np.int64)[:, None]], axis=1)
            mask = np.concatenate([mask[order], np.ones((len(ids), 1), np.int64)], axis=1)
            past = self._reorder(past, order)
            new = 1 if self.incremental else ids.shape[1]
            if all(len(d) >= beams for d in done):
                break
        for b in range(batch):
            for k in range(beams):
                done[b].append((float(beam_scores[b, k]) / (ids.shape[1] - length), ids[b * beams + k]))
        best = [max(d, key=lambda x: x[0])[1] for d in done]
        width = max(len(x) for x in best)
        # finished hypotheses repeat their EOS up to the longest, as transformers' beam search returns them
        return np.stack([np.pad(x, (0, width - len(x)), constant_values=x[-1]) for x in best])

    # ------------------------------------------------------------------------------------ pipeline API
    def _text_stream(self, streamer: Callable[[str], None]) -> Callable[[np.ndarray], None]:
        """Token ids -> the new text since the last call (decoding the whole continuation keeps spacing)."""
        tok, seen, shown = self.tokenizer, [], [""]

        def on_tokens(tokens: np.ndarray) -> None:
            seen.append(int(tokens[0]))
            text = tok.decode(seen, skip_special_tokens=True)
            if len(text) > len(shown[0]):
                streamer(text[len(shown[0]) :])
                shown[0] = text

        return on_tokens

    def run_batch(
        self,
        items: list[Any],
        return_full_text: bool = True,
        streamer: Callable[[str], None] | None = None,
        **kwargs: object,
    ) -> list[Any]:
        settings = self.settings(**kwargs)
        texts = [str(t) for t in items]
        ids, mask = self.encode(texts)
        tok = self.tokenizer
        stream = self._text_stream(streamer) if streamer is not None and len(texts) == 1 else None
        out = self.generate(ids, mask, settings, stream)
        results = []
        for i, text in enumerate(texts):
            n = int(mask[i].sum())  # left padding: the prompt's tokens are the last n
            full = tok.decode(out[i, ids.shape[1] - n :], skip_special_tokens=True)
            completion = full[len(tok.decode(ids[i, -n:], skip_special_tokens=True)) :]
            results.append([{"generated_text": (text + completion) if return_full_text else completion}])
        return results
