"""sentence-transformers folders: the whole embedding model, as Optimum exports it.

A folder with ``modules.json`` (Transformer -> Pooling -> optional Normalize) is what
``SentenceTransformer(folder)`` loads. Exporting only its transformer would give token states and leave
every user to re-implement the pooling; so the exported graph is the full model, with Optimum's outputs
``token_embeddings`` and ``sentence_embedding``. The pooling and normalization are our own small torch
modules (:mod:`.embedder`) built from the folder's configs (the sentence-transformers package is not needed to export),
computed as sentence-transformers computes them, so their nodes carry their own tags
(``/SentenceEmbedder/Pooling``, ``/SentenceEmbedder/Normalize``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import write_json
from ..errors import InvalidModelError

__all__ = [
    "MODULES_FILE",
    "SENTENCE_OUTPUTS",
    "SentenceFolder",
    "read_sentence_folder",
    "fit_tokenizer_length",
]

MODULES_FILE = "modules.json"
#: Optimum's output names for a sentence-transformers export.
SENTENCE_OUTPUTS = ("token_embeddings", "sentence_embedding")
_TOKENIZER_CONFIG = "tokenizer_config.json"
_SETTINGS_GLOB = "sentence_*_config.json"

#: The config keys of sentence-transformers before ``pooling_mode`` (still what most hub models have).
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_KINDS = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class SentenceFolder:
    """What a sentence-transformers folder says: where its transformer is, how it pools, whether it normalizes."""

    folder: Path
    transformer_path: str
    pooling: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None = None

    @property
    def transformer_dir(self) -> Path:
        return self.folder / self.transformer_path if self.transformer_path else self.folder

    def record(self) -> dict[str, Any]:
        """What the metadata says about the embedding (read by the feature-extraction pipeline)."""
        return {
            "library": "sentence-transformers",
            "output": SENTENCE_OUTPUTS[1],
            "token_output": SENTENCE_OUTPUTS[0],
            "pooling": list(self.pooling),
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
        }


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidModelError(f"cannot read {path}: {exc}") from exc


def _pooling_modes(config: dict[str, Any], where: Path) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in _LEGACY_KEYS.items() if config.get(key)) or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if not all(isinstance(m, str) for m in modes):
        raise InvalidModelError(f"{where}: pooling_mode must be a name or a list of names, got {mode!r}")
    return modes


def _modules(folder: Path) -> dict[str, dict[str, Any]]:
    """modules.json's entries keyed by kind (the class name ending ``type``); other kinds are refused."""
    entries = _read_json(folder / MODULES_FILE)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "type" in e for e in entries):
        raise InvalidModelError(f"{folder / MODULES_FILE} is not a list of modules with a 'type'")
    by_kind: dict[str, dict[str, Any]] = {}
    for entry in entries:
        kind = str(entry["type"]).rsplit(".", 1)[-1]
        if kind not in _KINDS:
            raise InvalidModelError(
                f"{folder}: sentence-transformers module {entry['type']!r} is not supported "
                f"(supported: {', '.join(_KINDS)})",
                hint="pass --library transformers to export the transformer alone",
            )
        by_kind[kind] = entry
    return by_kind


def read_sentence_folder(folder: str | Path) -> SentenceFolder | None:
    """The folder's sentence-transformers description, or None when it has no ``modules.json`` with Pooling."""
    folder = Path(folder)
    if not (folder / MODULES_FILE).is_file():
        return None
    modules = _modules(folder)
    if "Pooling" not in modules or "Transformer" not in modules:
        return None
    transformer_path = str(modules["Transformer"].get("path") or "")
    pooling_file = folder / str(modules["Pooling"].get("path") or "") / "config.json"
    pooling = _read_json(pooling_file) if pooling_file.is_file() else {}
    # The Transformer module's settings file is named after the model family it was first written for
    # (sentence-transformers tries seven such names); any of them holds max_seq_length.
    settings_files = sorted((folder / transformer_path).glob(_SETTINGS_GLOB))
    settings = _read_json(settings_files[0]) if settings_files else {}
    max_len = settings.get("max_seq_length") if isinstance(settings, dict) else None
    return SentenceFolder(
        folder,
        transformer_path,
        _pooling_modes(pooling if isinstance(pooling, dict) else {}, pooling_file),
        "Normalize" in modules,
        int(max_len) if isinstance(max_len, int) and max_len > 0 else None,
    )


def fit_tokenizer_length(folder: SentenceFolder, package: Path) -> None:
    """Give the tokenizer config copied into ``package`` the folder's ``max_seq_length`` (where
    sentence-transformers truncates), so the packaged tokenizer truncates there too."""
    tok_config = package / _TOKENIZER_CONFIG
    if folder.max_seq_length and tok_config.is_file():
        data = _read_json(tok_config)
        data["model_max_length"] = folder.max_seq_length
        write_json(tok_config, data)
