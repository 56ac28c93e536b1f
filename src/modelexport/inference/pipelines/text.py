"""Text tasks: feature extraction, text classification, token classification, question answering."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._numeric import softmax
from ...errors import ConfigError, InferenceError
from ...metadata.schema import KEY_EMBEDDING
from ...testtime.ensemble import merge_probabilities
from ..processors.text import TokenizedBatch
from .base import ClassificationMixin, ONNXPipeline, register_pipeline

__all__ = [
    "FeatureExtractionPipeline",
    "TextClassificationPipeline",
    "TokenClassificationPipeline",
    "QuestionAnsweringPipeline",
]


class _Legacy:
    """``top_k`` not given: transformers' legacy output (the best label alone; a list of one for one input)."""


_LEGACY = _Legacy()


@register_pipeline("feature-extraction")
class FeatureExtractionPipeline(ONNXPipeline):
    """The first output per input, ``[1, tokens, hidden]`` as nested lists (``return_tensors=True``: arrays).

    A sentence-embedding package (exported from a sentence-transformers folder; the metadata says which
    output is the embedding) returns one ``[hidden]`` vector per input, as ``SentenceTransformer.encode``
    does; ``output_value="token_embeddings"`` gives the token states instead (encode's argument name).
    """

    processor_kinds = ("tokenizer", "image_processor", "feature_extractor")
    takes_feeds = True

    def _output(self, output_value: str | None) -> str:
        name = output_value or (self.metadata.get(KEY_EMBEDDING) or {}).get("output") or self.output_names[0]
        if name not in self.output_names:
            raise ConfigError(f"output_value {name!r} is not an output of this model: {self.output_names}")
        return name

    def run_batch(
        self,
        items: list[Any],
        return_tensors: bool = False,
        output_value: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        feeds = self.processor(**{self.processor.modality: items})
        return self.run_feeds(feeds, return_tensors, output_value)

    def run_feeds(
        self,
        feeds: dict[str, np.ndarray],
        return_tensors: bool = False,
        output_value: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        name = self._output(output_value)
        first = self.forward(feeds)[name]
        pooled = name == (self.metadata.get(KEY_EMBEDDING) or {}).get("output")
        mask = feeds.get("attention_mask")
        rows = []
        for i in range(len(first)):
            out = first[i] if pooled else first[i : i + 1]
            if mask is not None and out.ndim == 3:
                out = out[:, : int(mask[i].sum())]
            rows.append(out if return_tensors else out.tolist())
        return rows


@register_pipeline("text-classification")
class TextClassificationPipeline(ClassificationMixin, ONNXPipeline):
    """``[{'label', 'score'}]`` per text; ``top_k`` (None: all labels) gives a ranked list per text."""

    takes_feeds = True  # except under text TTA, which augments the strings (the engine says so)

    def probabilities(self, items: list[str], function_to_apply: str | None) -> np.ndarray:
        if self.policy is not None and self.policy.tta_transforms:  # strings augmented, per model
            probs = [self.test_time_engine().predict_texts(items, self.processor)]
            probs += [m.predict_texts(items, self.processor) for m, _ in self.member_engines()]
            return merge_probabilities(probs) if len(probs) > 1 else probs[0]
        return self.feed_probabilities(self.processor(texts=items), function_to_apply)

    def run_batch(
        self,
        items: list[Any],
        top_k: int | None | _Legacy = _LEGACY,
        function_to_apply: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        return self._rank(self.probabilities([str(t) for t in items], function_to_apply), top_k)

    def run_feeds(
        self,
        feeds: dict[str, np.ndarray],
        top_k: int | None | _Legacy = _LEGACY,
        function_to_apply: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        return self._rank(self.feed_probabilities(feeds, function_to_apply), top_k)

    def _rank(self, probs: np.ndarray, top_k: int | None | _Legacy) -> list[Any]:
        if top_k is _LEGACY:
            return [self.ranked(row, 1)[0] for row in probs]
        return [self.ranked(row, top_k) for row in probs]

    def format(
        self, results: list[Any], single: bool, top_k: int | None | _Legacy = _LEGACY, **kwargs: object
    ) -> Any:
        if single:
            return [results[0]] if top_k is _LEGACY else results[0]
        return results


def _tag(label: str) -> tuple[str, str]:
    """(B or I, entity type) of an IOB label, as transformers reads it."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


@register_pipeline("token-classification")
class TokenClassificationPipeline(ONNXPipeline):
    """Per token (``entity, score, index, word, start, end``) or, with ``aggregation_strategy="simple"``,
    IOB groups (``entity_group, score, word, start, end``); special tokens and ``O`` are left out."""

    STRATEGIES = ("none", "simple")

    def _tokens(self, enc: TokenizedBatch, probs: np.ndarray, i: int, text: str) -> list[dict[str, Any]]:
        tokenizer, entities = self.processor.tokenizer, []
        for j, token_id in enumerate(enc["input_ids"][i]):
            if enc["special_tokens_mask"][i][j] or not enc["attention_mask"][i][j]:
                continue
            best = int(probs[i, j].argmax())
            start, end = (int(v) for v in enc["offset_mapping"][i][j])
            word = tokenizer.convert_ids_to_tokens(int(token_id))
            if int(token_id) == tokenizer.unk_token_id:  # as transformers: the text it stands for
                word = text[start:end]
            entities.append(
                {
                    "entity": self.label(best),
                    "score": probs[i, j, best],
                    "index": j,
                    "word": word,
                    "start": start,
                    "end": end,
                }
            )
        return entities

    def _group(self, tokens: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "entity_group": _tag(tokens[0]["entity"])[1],
            "score": np.nanmean([t["score"] for t in tokens]),
            "word": self.processor.tokenizer.convert_tokens_to_string([t["word"] for t in tokens]),
            "start": tokens[0]["start"],
            "end": tokens[-1]["end"],
        }

    def _simple(self, tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
        groups, current = [], []
        for token in tokens:
            bi, tag = _tag(token["entity"])
            if current and (tag != _tag(current[-1]["entity"])[1] or bi == "B"):
                groups.append(self._group(current))
                current = []
            current.append(token)
        return groups + ([self._group(current)] if current else [])

    def run_batch(
        self,
        items: list[Any],
        aggregation_strategy: str = "none",
        ignore_labels: tuple[str, ...] = ("O",),
        **kwargs: object,
    ) -> list[Any]:
        strategy = str(getattr(aggregation_strategy, "value", aggregation_strategy)).lower()
        if strategy not in self.STRATEGIES:
            raise ConfigError(
                f"aggregation_strategy must be one of {', '.join(self.STRATEGIES)}, got {aggregation_strategy!r}"
            )
        texts = [str(t) for t in items]
        enc = self.processor.encode(texts, return_offsets_mapping=True, return_special_tokens_mask=True)
        probs = softmax(self.forward(self.processor.feeds(enc))[self.output_names[0]].astype(np.float32))
        results = []
        for i in range(len(texts)):
            tokens = self._tokens(enc, probs, i, texts[i])
            found = self._simple(tokens) if strategy == "simple" else tokens
            results.append([e for e in found if e.get("entity", e.get("entity_group")) not in ignore_labels])
        return results


def _softmax_masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    masked = np.where(allowed, logits, -10000.0)
    out = np.exp(masked - masked.max())
    return out / out.sum()


def best_span(
    start: np.ndarray, end: np.ndarray, allowed: np.ndarray, max_answer_len: int
) -> tuple[int, int, float]:
    """(start, end, score) of the best answer span of one sequence: transformers' ``select_starts_ends`` and
    ``decode_spans`` with top_k=1, here so that question answering does not import transformers' pipelines
    (and torch with them). ``allowed``: context tokens (and CLS) that are not padding."""
    s, e = _softmax_masked(start, allowed), _softmax_masked(end, allowed)
    s[0] = e[0] = 0.0
    candidates = np.tril(np.triu(np.outer(s, e)), max_answer_len - 1)
    i, j = np.unravel_index(int(np.argmax(candidates)), candidates.shape)
    ok = set(np.flatnonzero(allowed).tolist()) | ({0} if allowed.any() else set())  # transformers' isin quirk
    if i not in ok or j not in ok:
        return 0, 0, 0.0
    return int(i), int(j), float(candidates[i, j])


@register_pipeline("question-answering")
class QuestionAnsweringPipeline(ONNXPipeline):
    """``{'score', 'start', 'end', 'answer'}`` per (question, context), with transformers' span decoding."""

    def normalize(self, inputs: object, kwargs: dict[str, Any]) -> tuple[list[Any], bool]:
        if inputs is None and "question" in kwargs:
            question, context = kwargs.pop("question"), kwargs.pop("context", None)
            if isinstance(question, list):
                contexts = context if isinstance(context, list) else [context] * len(question)
                return [{"question": q, "context": c} for q, c in zip(question, contexts, strict=True)], False
            inputs = {"question": question, "context": context}
        items, single = super().normalize(inputs, kwargs)
        for item in items:
            if not isinstance(item, dict) or not item.get("question") or not item.get("context"):
                raise InferenceError(
                    "question-answering takes question=..., context=... (or dicts with both keys)"
                )
        return items, single

    def __call__(self, inputs: object = None, *, batch_size: int | None = None, **kwargs: object) -> Any:
        items, single = self.normalize(inputs, kwargs)
        return super().__call__(items[0] if single else items, batch_size=batch_size, **kwargs)

    def run_batch(
        self,
        items: list[dict[str, str]],
        max_answer_len: int = 15,
        handle_impossible_answer: bool = False,
        **kwargs: object,
    ) -> list[Any]:
        questions = [str(it["question"]) for it in items]
        contexts = [str(it["context"]) for it in items]
        enc = self.processor.encode(
            questions, contexts, truncation="only_second", return_offsets_mapping=True
        )
        out = self.forward(self.processor.feeds(enc))
        start_logits, end_logits = out[self.output_names[0]], out[self.output_names[1]]
        cls_id = self.processor.tokenizer.cls_token_id
        results = []
        for i, context in enumerate(contexts):
            p_mask = np.array([s != 1 for s in enc.sequence_ids(i)], dtype=np.int64)
            ids = enc["input_ids"][i]
            if cls_id is not None:
                p_mask[np.flatnonzero(ids == cls_id)] = 0
            allowed = (p_mask == 0) & (enc["attention_mask"][i] != 0)
            first, last, score = best_span(start_logits[i], end_logits[i], allowed, max_answer_len)
            offsets = enc["offset_mapping"][i]
            s, e = int(offsets[first][0]), int(offsets[last][1])
            results.append({"score": score, "start": s, "end": e, "answer": context[s:e]})
        return results
