"""Tiny task models (random weights, built from configs) saved as Hugging Face folders with their processors.

No downloads: the text models share a small WordPiece vocabulary written here; the image model gets a
``ViTImageProcessor``, the audio model a ``Wav2Vec2FeatureExtractor``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.models.hf_models import HF_TINY

__all__ = ["WORDS", "TASK_MODELS", "save_task_model", "plain_cnn", "CNN_PROCESSOR", "CNN_LABELS"]

_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a is of in and what where who does did was to my name capital paris france london john lives live "
    "hello world good bad movie this great terrible i love it city river big small"
).split()
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
VOCAB = _SPECIAL + WORDS + _LETTERS + [f"##{c}" for c in _LETTERS] + [".", ",", "?", "!"]
_TEXT = dict(
    vocab_size=len(VOCAB),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
    max_position_embeddings=64,
)
LABELS3 = {0: "negative", 1: "neutral", 2: "positive"}

#: name -> (model_type, transformers class, config kwargs, processor kind)
TASK_MODELS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "seq_cls": ("bert", "AutoModelForSequenceClassification", dict(_TEXT, id2label=LABELS3), "text"),
    "token_cls": (
        "bert",
        "AutoModelForTokenClassification",
        dict(_TEXT, id2label={0: "O", 1: "B-LOC", 2: "I-LOC", 3: "B-PER"}),
        "text",
    ),
    "qa": ("bert", "AutoModelForQuestionAnswering", dict(_TEXT), "text"),
    "causal_lm": (
        "llama",
        "AutoModelForCausalLM",
        dict(_TEXT, num_key_value_heads=1, pad_token_id=0, bos_token_id=2, eos_token_id=3),
        "text",
    ),
    "image_cls": (
        "vit",
        "AutoModelForImageClassification",
        dict(HF_TINY["vit"][2], id2label={0: "cat", 1: "dog", 2: "bird"}),
        "image",
    ),
    "audio_cls": (
        "wav2vec2",
        "AutoModelForAudioClassification",
        dict(HF_TINY["wav2vec2"][2], id2label={0: "yes", 1: "no"}, classifier_proj_size=16),
        "audio",
    ),
    "object_det": (
        "detr",
        "AutoModelForObjectDetection",
        dict(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone=None,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            num_queries=5,
            id2label={0: "cat", 1: "dog"},
            backbone_config={
                "model_type": "resnet",
                "embedding_size": 8,
                "hidden_sizes": [8, 16],
                "depths": [1, 1],
                "out_features": ["stage2"],
            },
        ),
        "detection",
    ),
}


def _tokenizer(folder: Path) -> Any:
    from transformers import BertTokenizerFast

    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    # positional: transformers 4 calls it vocab_file, 5 vocab (5 ignores vocab_file: every token [UNK])
    tok = BertTokenizerFast(str(vocab), do_lower_case=True, model_max_length=64)
    return tok


def save_task_model(name: str, folder: Path) -> Path:
    """Build the tiny model ``name`` (seeded) and save it with its processor into ``folder``."""
    import transformers

    model_type, cls_name, kwargs, kind = TASK_MODELS[name]
    folder.mkdir(parents=True, exist_ok=True)
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, cls_name).from_config(config).eval()
    model.save_pretrained(str(folder))
    if kind == "text":
        _tokenizer(folder).save_pretrained(str(folder))
    elif kind == "image":
        transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(folder))
    elif kind == "detection":
        transformers.DetrImageProcessor(size={"height": 64, "width": 64}, do_pad=False).save_pretrained(
            str(folder)
        )
    else:
        transformers.Wav2Vec2FeatureExtractor(
            feature_size=1, sampling_rate=16000, do_normalize=True, return_attention_mask=False
        ).save_pretrained(str(folder))
    return folder


CNN_LABELS = {0: "zero", 1: "one", 2: "two", 3: "three"}
#: Pre-processing of the plain CNN, in transformers' image-processor form (8 x 8 grayscale digits).
CNN_PROCESSOR = {
    "size": {"height": 8, "width": 8},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5],
    "image_std": [0.5],
    "resample": 2,
}


def plain_cnn() -> Any:
    from tests.models.torch_models import SmallCNN

    torch.manual_seed(0)
    return SmallCNN(in_channels=1, num_classes=4).eval()
