"""Tiny causal LMs (random weights, the real MiniLM tokenizer) exported with a key/value cache, once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: name -> (model_type, config kwargs); vocab and special tokens come from the tokenizer.
CAUSAL_LM: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": (
        "llama",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            num_key_value_heads=1,
            max_position_embeddings=64,
        ),
    ),
    "gpt2": ("gpt2", dict(n_embd=32, n_layer=2, n_head=2, n_positions=64)),
    "qwen2": (
        "qwen2",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            num_key_value_heads=1,
            max_position_embeddings=64,
        ),
    ),
    # a sliding-window layer (window 4) before a full one: prompts longer than the window
    "gemma3": (
        "gemma3_text",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=64,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "phi3": (
        "phi3",
        dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            num_key_value_heads=1,
            max_position_embeddings=64,
        ),
    ),
}


def save_causal_lm(name: str, tokenizer_dir: Path, folder: Path) -> Path:
    """A seeded tiny causal LM saved with the tokenizer (EOS = [SEP], pad = [PAD])."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    model_type, kwargs = CAUSAL_LM[name]
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        **kwargs,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def export_causal_lm(name: str, minilm_dir: Path, root: Path, **options: Any) -> tuple[Path, Path, Any]:
    from modelexport.export.api import export

    src = save_causal_lm(name, minilm_dir, root / f"{name}_src")
    result = export(src, root / f"{name}_onnx", task="text-generation-with-past", **options)
    return src, root / f"{name}_onnx", result


@pytest.fixture(scope="session")
def llama_with_past(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(source folder, export folder, ExportResult) of the tiny Llama, topology verified."""
    return export_causal_lm("llama", minilm_dir, tmp_path_factory.mktemp("gen"), verify_topology=True)


def save_t5(tokenizer_dir: Path, folder: Path) -> Path:
    """A seeded tiny T5 (2 + 2 layers) with the MiniLM tokenizer: decoding starts at [PAD], ends at [SEP];
    weights drawn 2x wider than T5's default (``initializer_factor``) and seed 7, so that greedy and beam
    tokens vary from step to step under transformers 4 and 5 (their initialisations differ; at 1.0 every seed
    repeats one or two tokens), with logits small enough for -O2 to stay within the 1e-4 parity check."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    config = transformers.T5Config(
        vocab_size=len(tok),
        d_model=32,
        d_kv=16,
        d_ff=37,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        decoder_start_token_id=tok.pad_token_id,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.sep_token_id,
        initializer_factor=2.0,
    )
    torch.manual_seed(7)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_whisper(tokenizer_dir: Path, folder: Path) -> Path:
    """A seeded tiny Whisper (16 mel bins, 1 s windows: 100 frames) with transformers' own feature extractor
    and the MiniLM tokenizer; weights drawn wide (init_std 0.5) so greedy tokens vary from step to step."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    extractor = transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=1)
    config = transformers.WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_source_positions=50,
        max_target_positions=64,
        decoder_start_token_id=tok.cls_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=tok.pad_token_id,
        suppress_tokens=[],
        init_std=0.5,
    )
    torch.manual_seed(0)
    transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    extractor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def t5_with_past(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(source folder, export folder, ExportResult) of the tiny T5 as an encoder-decoder package."""
    from modelexport.export.api import export

    root = tmp_path_factory.mktemp("t5")
    src = save_t5(minilm_dir, root / "src")
    return src, root / "out", export(src, root / "out", task="text2text-generation-with-past")


class VLMPackages:
    """Tiny vision-language models saved as folders and exported once per session, per (family, options)."""

    def __init__(self, minilm_dir: Path, root: Path) -> None:
        self.minilm_dir, self.root = minilm_dir, root
        self._sources: dict[str, Path] = {}
        self._exports: dict[tuple[str, str], tuple[Path, Any]] = {}

    def source(self, family: str) -> Path:
        from tests.models.vlm import VLM_FAMILIES

        if family not in self._sources:
            self._sources[family] = VLM_FAMILIES[family](self.minilm_dir, self.root / f"{family}_src")
        return self._sources[family]

    def export(
        self, family: str, task: str = "image-text-to-text-with-past", **options: Any
    ) -> tuple[Path, Any]:
        """(package folder, ExportResult)."""
        from modelexport.export.api import export

        key = (family, repr((task, sorted(options.items()))))
        if key not in self._exports:
            out = self.root / f"{family}_{len(self._exports)}"
            self._exports[key] = (out, export(self.source(family), out, task=task, **options))
        return self._exports[key]


@pytest.fixture(scope="session")
def vlm_packages(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> VLMPackages:
    return VLMPackages(minilm_dir, tmp_path_factory.mktemp("vlm"))
