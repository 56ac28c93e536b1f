"""Tiny Hugging Face models from configs (random weights): the architectures users export most."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HF_TINY", "tiny_hf_model"]

_TEXT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)

#: name -> (model_type, AutoModel class name, config kwargs)
HF_TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": ("bert", "AutoModel", dict(_TEXT, max_position_embeddings=64)),
    "gpt2": ("gpt2", "AutoModel", dict(vocab_size=99, n_embd=32, n_layer=2, n_head=2, n_positions=64)),
    "bart": (
        "bart",
        "AutoModel",
        dict(
            vocab_size=99,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
        ),
    ),
    "vit": ("vit", "AutoModel", dict(_TEXT, image_size=32, patch_size=8, num_channels=3)),
    "resnet": (
        "resnet",
        "AutoModel",
        dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_channels=3),
    ),
    "wav2vec2": (
        "wav2vec2",
        "AutoModel",
        dict(
            _TEXT,
            conv_dim=(16, 16),
            conv_stride=(5, 4),
            conv_kernel=(10, 8),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
            do_stable_layer_norm=True,
        ),
    ),
    "llama": (
        "llama",
        "AutoModel",
        dict(_TEXT, num_key_value_heads=1, max_position_embeddings=64),
    ),
}


def tiny_hf_model(name: str) -> Any:
    """A randomly initialised tiny model (seeded), in eval mode."""
    import transformers

    model_type, auto_cls, kwargs = HF_TINY[name]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, auto_cls).from_config(config)
    return model.eval()
