"""``FastTokenizer``: transformers' fast-tokenizer call on the ``tokenizers`` library alone.

Serving a text model needs only ``tokenizer.json`` and ``tokenizer_config.json``; importing transformers
for them costs seconds (it pulls in torch). This wrapper sets padding and truncation on the backend the
way ``PreTrainedTokenizerFast`` does, so the feeds are the same. Folders whose config asks transformers to
rebuild parts of the backend at load time (lower-casing, prefix space, BOS/EOS templates) and features it
does not cover go to transformers' own tokenizer (:meth:`FastTokenizer.full`), said at DEBUG.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer
    from transformers import BatchEncoding, PreTrainedTokenizerBase

__all__ = ["FastEncoding", "FastTokenizer", "UNCOVERED_CHECKS"]

log = logging.getLogger(__name__)

#: transformers' "no limit" model_max_length (``VERY_LARGE_INTEGER``).
_VERY_LARGE = int(1e30)
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: tokenizer_config keys that make a transformers fast tokenizer rebuild its post-processor at load time.
_TEMPLATE_KEYS = ("add_bos_token", "add_eos_token")
#: transformers' ``clean_up_tokenization`` (what ``decode`` does after the backend when the config asks).
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
#: Tokenizer classes whose ``clean_up_tokenization_spaces`` defaults to True (transformers 5; every fast class of
#: 4.57 and ``TokenizersBackend`` default to False): a folder that names one and does not set it decodes in
#: transformers.
_CLEAN_UP_BY_DEFAULT = (
    "BertweetTokenizer",
    "CTRLTokenizer",
    "PhobertTokenizer",
    "PLBartTokenizer",
    "ProphetNetTokenizer",
    "TapasTokenizer",
)
#: transformers' truncation argument -> the backend's strategy.
_TRUNCATION: dict[bool | str, str] = {
    True: "longest_first",
    "longest_first": "longest_first",
    "only_first": "only_first",
    "only_second": "only_second",
}


def _content(token: object) -> str | None:
    """A special token of tokenizer_config.json: a string or a serialized AddedToken."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _bert_normalizer(spec: dict[str, Any], config: dict[str, Any]) -> str | None:
    norm = spec.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return None
    pairs = {"lowercase": "do_lower_case", "strip_accents": "strip_accents"}
    pairs["handle_chinese_chars"] = "tokenize_chinese_chars"
    for ours, theirs in pairs.items():
        if theirs in config and config[theirs] != norm.get(ours):
            return f"{theirs}={config[theirs]!r} differs from the normalizer's {ours}={norm.get(ours)!r}"
    return None


def _prefix_space(spec: dict[str, Any], config: dict[str, Any]) -> str | None:
    if "add_prefix_space" not in config:
        return None
    found = [
        part.get("add_prefix_space")
        for part in (spec.get("pre_tokenizer") or {}, spec.get("post_processor") or {})
        if "add_prefix_space" in part
    ]
    if any(v != config["add_prefix_space"] for v in found) or not found:
        return "add_prefix_space in tokenizer_config.json is applied by transformers at load time"
    return None


def _templates(spec: dict[str, Any], config: dict[str, Any]) -> str | None:
    keys = [k for k in _TEMPLATE_KEYS if k in config]
    return f"{', '.join(keys)} rebuild the post-processor in transformers" if keys else None


def _added_tokens(spec: dict[str, Any], config: dict[str, Any]) -> str | None:
    known = {int(t["id"]): t for t in spec.get("added_tokens") or []}
    vocab = (spec.get("model") or {}).get("vocab")
    for index, token in (config.get("added_tokens_decoder") or {}).items():
        content = _content(token)
        in_vocab = isinstance(vocab, dict) and vocab.get(content) == int(index)
        backend = known.get(int(index))
        if (backend or {}).get("content") != content and not in_vocab:
            return f"added token {content!r} (id {index}) is not in tokenizer.json"
        special = token.get("special") if isinstance(token, dict) else None
        if backend is not None and special is not None and bool(backend.get("special")) != bool(special):
            return f"added token {content!r} (id {index}) is special in one file only (decoding would differ)"
    return None


#: Checks over (tokenizer.json, tokenizer_config.json): a reason string sends the folder to transformers.
UNCOVERED_CHECKS: list[Callable[[dict[str, Any], dict[str, Any]], str | None]] = [
    _bert_normalizer,
    _prefix_space,
    _templates,
    _added_tokens,
]


class FastEncoding(dict[str, np.ndarray]):
    """The arrays of a batch (like transformers' ``BatchEncoding``), plus ``sequence_ids(i)``."""

    def __init__(self, data: dict[str, np.ndarray], encodings: list[Encoding]) -> None:
        super().__init__(data)
        self.encodings = encodings

    def sequence_ids(self, index: int = 0) -> list[int | None]:
        return self.encodings[index].sequence_ids


class FastTokenizer:
    """The subset of a transformers fast tokenizer the ONNX pipelines use, over ``tokenizers.Tokenizer``."""

    def __init__(self, backend: Tokenizer, config: dict[str, Any], folder: Path) -> None:
        self.backend = backend
        self.folder = folder
        self.config = config
        self.model_max_length = int(config.get("model_max_length") or _VERY_LARGE)
        self.padding_side = str(config.get("padding_side") or "right")
        self.truncation_side = str(config.get("truncation_side") or "right")
        self.model_input_names = list(
            config.get("model_input_names") or ("input_ids", "token_type_ids", "attention_mask")
        )
        self.special_tokens = {n: _content(config.get(n)) for n in _SPECIAL_NAMES if _content(config.get(n))}
        self._full: PreTrainedTokenizerBase | None = None

    @classmethod
    def from_folder(cls, folder: Path) -> FastTokenizer | None:
        """The fast tokenizer of ``folder``; None (reason at DEBUG) where transformers' own is needed."""
        file = folder / "tokenizer.json"
        if not file.is_file():
            log.debug("no tokenizer.json in %s: using transformers' AutoTokenizer", folder)
            return None
        try:
            spec = json.loads(file.read_text(encoding="utf-8"))
            cfg_file = folder / "tokenizer_config.json"
            config = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
        except (OSError, json.JSONDecodeError) as exc:
            log.debug(
                "tokenizer files in %s do not read (%s): using transformers' AutoTokenizer", folder, exc
            )
            return None
        for check in UNCOVERED_CHECKS:
            reason = check(spec, config)
            if reason:
                log.debug("%s: %s; using transformers' AutoTokenizer", folder, reason)
                return None
        from tokenizers import Tokenizer

        try:
            backend = Tokenizer.from_str(json.dumps(spec))
        except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception
            log.debug("tokenizers cannot read %s (%s): using transformers' AutoTokenizer", file, exc)
            return None
        return cls(backend, config, folder)

    # ------------------------------------------------------------------------------ special tokens
    def __setattr__(self, name: str, value: object) -> None:
        """``tokenizer.pad_token = "[PAD]"`` sets a special token, as on transformers' tokenizers."""
        if name in _SPECIAL_NAMES:
            if value is None:
                self.special_tokens.pop(name, None)
            else:
                self.special_tokens[name] = str(value)
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        """``cls_token`` / ``cls_token_id`` ... as transformers names them (None when the config has none)."""
        base = name[: -len("_id")] if name.endswith("_id") else name
        if base not in _SPECIAL_NAMES:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        token = self.__dict__.get("special_tokens", {}).get(base)
        if name == base or token is None:
            return token
        return self.backend.token_to_id(token)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self.special_tokens)

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        unk = self.unk_token_id
        if isinstance(tokens, str):
            found = self.backend.token_to_id(tokens)
            return unk if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self.backend.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    # ------------------------------------------------------------------------------------ decoding
    @property
    def clean_up_tokenization_spaces(self) -> bool:
        return bool(self.config.get("clean_up_tokenization_spaces", False))

    def _decode_uncovered(self) -> str | None:
        """Why transformers' own ``decode`` is needed for this folder (None: the backend's is the same)."""
        named = str(self.config.get("tokenizer_class") or "").removesuffix("Fast")
        if "clean_up_tokenization_spaces" not in self.config and named in _CLEAN_UP_BY_DEFAULT:
            return f"{named} cleans up tokenization spaces by default"
        if self.clean_up_tokenization_spaces and type(self.backend.model).__name__ == "BPE":
            return "transformers 5 skips clean_up_tokenization_spaces for BPE tokenizers, 4 applies it"
        return None

    def decode(self, token_ids: int | Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of one sequence of ids, as transformers' fast tokenizers decode: the backend's decoder, then the
        clean-up of spaces before punctuation where the config asks for it."""
        ids = [int(i) for i in (token_ids if hasattr(token_ids, "__iter__") else [token_ids])]
        reason = self._decode_uncovered()
        if reason is not None:
            log.debug("%s: %s; decoding with transformers' tokenizer", self.folder, reason)
            return str(self.full().decode(ids, skip_special_tokens=skip_special_tokens))
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def batch_decode(
        self, sequences: Iterable[int | Iterable[int]], skip_special_tokens: bool = False
    ) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    # ------------------------------------------------------------------------------------ encoding
    def _configure(
        self, padding: bool | str | None, truncation: bool | str | None, max_length: int | None, pairs: bool
    ) -> None:
        """Padding and truncation on the backend, as ``PreTrainedTokenizerFast.set_truncation_and_padding``."""
        if truncation is True and max_length is None:
            truncation = False if self.model_max_length >= _VERY_LARGE else truncation
            max_length = self.model_max_length
        if truncation in (False, None, "do_not_truncate"):
            self.backend.no_truncation()
        else:
            strategy = _TRUNCATION.get(truncation)
            if strategy is None:
                raise ValueError(f"truncation={truncation!r} is not covered by {type(self).__name__}")
            self.backend.enable_truncation(
                max_length, stride=0, strategy=strategy, direction=self.truncation_side
            )
        if padding in (False, None, "do_not_pad"):
            self.backend.no_padding()
            return
        if self.pad_token is None:
            raise ValueError("padding needs a pad token and the tokenizer has none")
        if padding == "max_length" and max_length is None:
            max_length = self.model_max_length
        self.backend.enable_padding(
            length=max_length if padding == "max_length" else None,
            direction=self.padding_side,
            pad_id=self.pad_token_id,
            pad_type_id=0,
            pad_token=self.pad_token,
        )

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        *,
        padding: bool | str | None = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = "np",
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        **unknown: object,
    ) -> FastEncoding | BatchEncoding:
        """Token arrays for a batch; options this wrapper does not cover go to transformers' tokenizer."""
        if unknown or return_tensors != "np":
            log.debug("tokenizer options %s need transformers' tokenizer", sorted(unknown) or return_tensors)
            full = self.full()
            return full(
                text,
                text_pair,
                padding=padding,
                truncation=truncation,
                max_length=max_length,
                return_tensors=return_tensors,
                return_offsets_mapping=return_offsets_mapping,
                return_special_tokens_mask=return_special_tokens_mask,
                **unknown,
            )
        texts = [text] if isinstance(text, str) else list(text)
        pairs = (
            None if text_pair is None else ([text_pair] if isinstance(text_pair, str) else list(text_pair))
        )
        self._configure(padding, truncation, max_length, pairs is not None)
        items = texts if pairs is None else list(zip(texts, pairs, strict=True))
        encodings = self.backend.encode_batch(items, add_special_tokens=True)
        return FastEncoding(
            self._arrays(encodings, return_offsets_mapping, return_special_tokens_mask), encodings
        )

    def _arrays(self, encodings: list[Encoding], offsets: bool, special: bool) -> dict[str, np.ndarray]:
        fields = {"input_ids": "ids"}
        if "token_type_ids" in self.model_input_names:
            fields["token_type_ids"] = "type_ids"
        if "attention_mask" in self.model_input_names:
            fields["attention_mask"] = "attention_mask"
        if special:
            fields["special_tokens_mask"] = "special_tokens_mask"
        if offsets:
            fields["offset_mapping"] = "offsets"
        return {
            key: np.array([getattr(e, attr) for e in encodings], dtype=np.int64)
            for key, attr in fields.items()
        }

    def full(self) -> PreTrainedTokenizerBase:
        """transformers' tokenizer for the same folder: for what this wrapper does not cover (loaded once)."""
        if self._full is None:
            from transformers import AutoTokenizer

            log.debug("loading transformers' AutoTokenizer for %s", self.folder)
            self._full = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        return self._full
