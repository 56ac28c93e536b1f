"""Encoder-decoder generation on ONNX Runtime: ``text2text-generation`` and (Whisper-style)
``automatic-speech-recognition`` on a package exported with ``--task *-with-past``.

The encoder runs once per batch. Its output (and the encoder mask) and the cross-attention cache of the
first step stay OrtValues bound to every later step; the first step runs ``decoder_model.onnx``, every
later one ``decoder_with_past_model.onnx`` with the self-attention cache of the step before. Decoding
(greedy, sampling, beams, repetition penalty, EOS, padding of finished rows) is the text-generation
pipeline's own loop: this class only supplies the steps, from the decoder's start token, as transformers'
``generate`` does for encoder-decoder models.

A generation config that describes a prompted decoder (``lang_to_id``, ``task_to_id``,
``no_timestamps_token_id``, ``forced_decoder_ids``: Whisper checkpoints) gets transformers' prompt: the
start token, the language (given, forced, or detected from the first step's scores over the language
tokens), the task, and the no-timestamps token; ``suppress_tokens`` / ``begin_suppress_tokens`` are the
decoding loop's, as for every model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...errors import ConfigError, MetadataError
from ...metadata.schema import CACHE_INPUT_PREFIX
from ...onnxfile import package_components
from ...runtime.session import create_session
from ..processors import BaseONNXProcessor
from ..processors.text import Tokenizer, load_tokenizer
from .base import register_pipeline
from .generation import GenerationSettings, TextGenerationPipeline, device_of, run_bound

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, OrtValue

__all__ = ["SPEECH_DECODER_TASKS", "Text2TextGenerationPipeline", "SpeechRecognitionPipeline"]

_PRESENT, _PAST = "present.", CACHE_INPUT_PREFIX
#: The decoder tasks of prompted speech decoders (Whisper's ``task=``), not pipeline tasks.
SPEECH_DECODER_TASKS = ("transcribe", "translate")
#: Encoder outputs every decoder step reads, by decoder input name.
_ENCODER_STATES = ("encoder_hidden_states", "encoder_attention_mask")


def _ort() -> ModuleType:
    import onnxruntime

    return onnxruntime


@dataclass
class _State:
    """What a decoder step binds besides its new token: encoder states and the cache, as OrtValues."""

    encoder: dict[str, OrtValue]
    #: "{layer}.{decoder|encoder}.{key|value}" -> value
    past: dict[str, OrtValue] = field(default_factory=dict)


class _EncoderDecoder(TextGenerationPipeline):
    """The steps of an encoder-decoder package; the pipeline's session is its encoder (the package's entry)."""

    def __init__(self, session: InferenceSession, processor: BaseONNXProcessor, **kwargs: object) -> None:
        super().__init__(session, processor, **kwargs)
        folder = self.model_path.parent if self.model_path else None
        graphs = package_components(folder, self.model_path) if folder else {}  # the encoder's own set
        missing = [r for r in ("decoder", "decoder_with_past") if r not in graphs]
        if missing:
            raise MetadataError(
                f"{self.task} needs the decoder graphs of an encoder-decoder package; "
                f"{folder or 'the model'} has no {', '.join(missing)}",
                hint="export with --task text2text-generation-with-past (or automatic-speech-recognition-with-past)"
                " and pass the output folder; single-graph speech models (CTC heads) have no pipeline here yet",
            )
        self.first_step, _ = create_session(graphs["decoder"], self.session_config)
        self.with_past, _ = create_session(graphs["decoder_with_past"], self.session_config)
        self.device = device_of(self.with_past)
        self.first_outputs = [o.name for o in self.first_step.get_outputs()][1:]
        self.past_outputs = [o.name for o in self.with_past.get_outputs()][1:]
        start = self.record.get(
            "decoder_start_token_id", self.generation_config.get("decoder_start_token_id")
        )
        if start is None:
            raise MetadataError("the package records no decoder_start_token_id; cannot start decoding")
        self.start_id = int(start)

    @property
    def incremental(self) -> bool:
        return True

    # ---------------------------------------------------------------------------------------- steps
    def _encode(self, feeds: dict[str, np.ndarray], rows: int) -> dict[str, OrtValue]:
        """Run the encoder; its output and mask as OrtValues, each row repeated for its beams."""
        ort = _ort()
        hidden = self.session.run(None, feeds)[0]
        per_row = rows // len(hidden)
        states = {"encoder_hidden_states": hidden, "encoder_attention_mask": feeds.get("attention_mask")}
        return {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(np.repeat(value, per_row, axis=0)))
            for name, value in states.items()
            if value is not None
        }

    def _begin(
        self, ids: np.ndarray, mask: np.ndarray, context: dict[str, np.ndarray] | None, room: int = 0
    ) -> _State:
        """``context``: the encoder's feeds (:meth:`generate_from` always gives them); ``room`` is unused (the
        decoder's cache grows by concatenation)."""
        return _State(self._encode(context, len(ids)))

    def _advance(
        self, ids: np.ndarray, mask: np.ndarray, new: int, past: _State
    ) -> tuple[np.ndarray, _State]:
        first = not past.past
        session, outputs = (
            (self.first_step, self.first_outputs) if first else (self.with_past, self.past_outputs)
        )
        takes = {i.name for i in session.get_inputs()}
        values = {k: v for k, v in past.encoder.items() if k in takes}
        values.update({_PAST + k: v for k, v in past.past.items() if _PAST + k in takes})
        feeds = {"input_ids": np.ascontiguousarray(ids if first else ids[:, -1:])}
        scores, presents = run_bound(session, feeds, values, outputs, self.device)
        cache = {**past.past, **{n.removeprefix(_PRESENT): v for n, v in zip(outputs, presents, strict=True)}}
        return scores, _State(past.encoder, cache)

    def _reorder(self, past: _State, order: np.ndarray) -> _State:
        """Beams reorder within their own prompt, whose encoder rows are all equal: only the decoder's
        own cache moves."""
        ort = _ort()
        moved = {
            k: ort.OrtValue.ortvalue_from_numpy(v.numpy()[order]) if ".decoder." in f".{k}" else v
            for k, v in past.past.items()
        }
        return _State(past.encoder, moved)

    # ---------------------------------------------------------------------------------- the prompt
    def _forced_tokens(self) -> list[int | None]:
        """The legacy ``forced_decoder_ids`` ([position, token] from position 1 on) after the start token."""
        forced = self.generation_config.get("forced_decoder_ids") or self.model_config.get(
            "forced_decoder_ids"
        )
        tokens: list[int | None] = []
        for position, token in forced or ():
            if position != len(tokens) + 1:
                raise MetadataError(
                    f"forced_decoder_ids {forced} do not follow the decoder prompt (positions 1, 2, ...)",
                    hint="set language= and task= instead, or fix generation_config.json",
                )
            tokens.append(token)
        return tokens

    def _language_id(self, language: str) -> int:
        table: dict[str, int] = self.generation_config.get("lang_to_id") or {}
        if not table:
            raise ConfigError(
                f"language {language!r}: this package has no language tokens (no lang_to_id in its generation config)",
                hint="leave the language out: the model decodes without a language token",
            )
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in table:
            codes = ", ".join(sorted(t.strip("<|>") for t in table)[:20])
            raise ConfigError(
                f"language {language!r} is not one of this model's languages", hint=f"use a code: {codes}"
            )
        return int(table[token])

    def _detect_language(self, feeds: dict[str, np.ndarray], batch: int) -> np.ndarray:
        """Per row, the language token scored highest after the start token (transformers' detect_language)."""
        start = np.full((batch, 1), self.start_id, dtype=np.int64)
        scores, _ = self._advance(start, np.ones_like(start), 1, self._begin(start, start, feeds))
        ids = np.array(sorted(int(i) for i in self.generation_config["lang_to_id"].values()))
        return ids[scores[:, ids].argmax(-1)]

    def check_prompt(self, language: str | None = None, task: str | None = None) -> None:
        """Refuse a language or decoder task the package's generation config cannot prompt, before any run."""
        g = self.generation_config
        tasks: dict[str, int] = g.get("task_to_id") or {}
        if (language or task) and g.get("is_multilingual") is False:
            raise ConfigError("language= and task= need a multilingual model; this one is English-only")
        if task is not None and not tasks:
            raise ConfigError(
                f"task {task!r}: this package has no decoder task tokens (no task_to_id in its generation config)",
                hint="leave the task out: the model decodes without a task token",
            )
        if task is not None and task not in tasks:
            raise ConfigError(
                f"task {task!r} is not one of this model's decoder tasks",
                hint=f"use one of {', '.join(sorted(tasks))}",
            )
        if language is not None:
            self._language_id(language)

    def decoder_prompt(
        self, feeds: dict[str, np.ndarray], batch: int, language: str | None = None, task: str | None = None
    ) -> np.ndarray:
        """The decoder's first tokens per row, as transformers' ``generate`` builds them from the generation
        config: start token [+ language] [+ task] [+ no-timestamps]; the start token alone for other models."""
        g = self.generation_config
        tasks: dict[str, int] = g.get("task_to_id") or {}
        self.check_prompt(language, task)
        head: list[int | None] = [
            self.start_id,
            *(self._forced_tokens() if language is None and task is None else []),
        ]
        langs: list[int] | None = None
        if language is not None:
            langs = [self._language_id(language)] * batch
        elif g.get("lang_to_id") and (len(head) <= 1 or head[1] is None):
            langs = self._detect_language(feeds, batch).tolist()
        rows = []
        for r in range(batch):
            row = list(head)
            if langs is not None:
                row[1:2] = [langs[r]]
            if task is not None:
                row.append(tasks[task])
            elif language is not None and tasks and not set(row) & set(tasks.values()):
                row.append(tasks["transcribe"])
            no_timestamps = g.get("no_timestamps_token_id")
            if no_timestamps is not None and row[-1] != no_timestamps:
                row.append(no_timestamps)
            rows.append([int(t) for t in row if t is not None])
        return np.array(rows, dtype=np.int64)

    # --------------------------------------------------------------------------------------- public
    def generate_from(
        self,
        encoder_feeds: dict[str, np.ndarray],
        settings: GenerationSettings,
        streamer: Callable[[np.ndarray], None] | None = None,
        language: str | None = None,
        task: str | None = None,
    ) -> np.ndarray:
        """Decoder token ids (the decoder prompt, then the generated ones) for a batch of encoder inputs."""
        batch = len(next(iter(encoder_feeds.values())))
        start = self.decoder_prompt(encoder_feeds, batch, language, task)
        return self.generate(start, np.ones_like(start), settings, streamer, context=encoder_feeds)

    def _decoded(
        self, items: list[Any], streamer: Callable[[str], None] | None, **kwargs: object
    ) -> list[str]:
        options = {**(kwargs.pop("generate_kwargs", None) or {}), **kwargs}
        if options.pop("return_timestamps", False):
            raise ConfigError(
                "return_timestamps is not supported by this pipeline yet",
                hint="leave it off: the text comes back without timestamps",
            )
        language, task = options.pop("language", None), options.pop("task", None)
        settings = self.settings(**options)
        feeds = self.processor(**{self.processor.modality: items})
        stream = self._text_stream(streamer) if streamer is not None and len(items) == 1 else None
        out = self.generate_from(feeds, settings, stream, language=language, task=task)
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in out]


@register_pipeline("text2text-generation")
class Text2TextGenerationPipeline(_EncoderDecoder):
    """``[{"generated_text": ...}]`` for one text, one dict per text for a list, like transformers'
    text2text-generation pipeline, with its defaults (4 beams, 256 new tokens) where the model sets none."""

    pipeline_defaults: ClassVar[dict[str, Any]] = {"num_beams": 4, "max_new_tokens": 256}

    def format(self, results: list[Any], single: bool, **kwargs: object) -> Any:
        return results[0] if single else [r[0] for r in results]

    def run_batch(
        self, items: list[Any], streamer: Callable[[str], None] | None = None, **kwargs: object
    ) -> list[Any]:
        return [[{"generated_text": t}] for t in self._decoded([str(i) for i in items], streamer, **kwargs)]


@register_pipeline("automatic-speech-recognition")
class SpeechRecognitionPipeline(_EncoderDecoder):
    """``{"text": ...}`` per waveform or .wav file, like transformers' speech-recognition pipeline
    (encoder-decoder packages: Whisper-style ``automatic-speech-recognition-with-past`` exports)."""

    processor_kinds = ("feature_extractor",)
    processor_arg = "feature_extractor"
    pipeline_defaults: ClassVar[dict[str, Any]] = {"max_new_tokens": 256}

    def __init__(self, session: InferenceSession, processor: BaseONNXProcessor, **kwargs: object) -> None:
        super().__init__(session, processor, **kwargs)
        self._tokenizer: Tokenizer = load_tokenizer(self.model_path.parent if self.model_path else None)
        full = getattr(self._tokenizer, "full", None)
        if callable(full):
            self._tokenizer = full()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def run_batch(
        self, items: list[Any], streamer: Callable[[str], None] | None = None, **kwargs: object
    ) -> list[Any]:
        return [{"text": t} for t in self._decoded(items, streamer, **kwargs)]
