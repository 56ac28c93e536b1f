"""Tiny vision-language models (random weights) saved as folders the way users have them: config, weights,
tokenizer (the MiniLM WordPiece vocabulary with the family's special tokens added), transformers' own image
processor class, ``processor_config.json`` and a chat template.

One builder per family; each returns the folder. The families cover the splits the field uses: a plain
projector (LLaVA), packed patches with ``image_grid_thw`` and M-RoPE (Qwen2-VL), image splitting into crops
(Idefics3), bidirectional attention over image tokens (Gemma 3) or over the whole prompt (PaliGemma).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A chat template in the shape of the real ones: each message's role, its images as the processor's image
#: placeholder, its text; the generation prompt at the end.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}:"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %} {{ IMAGE }}"
    "{% else %} {{ part['text'] }}{% endif %}{% endfor %}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_TEXT = dict(
    hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)
#: The vision towers' widths (CLIP, SigLIP, Idefics3): 32 x 32 images in 8 x 8 patches.
_VISION = dict(
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
)


def _tokenizer(tokenizer_dir: Path, specials: list[str], extra: dict[str, str] | None = None) -> Any:
    import transformers

    # a decoder's tokenizer: no token type ids
    kwargs: dict[str, Any] = {"model_input_names": ["input_ids", "attention_mask"]}
    if extra:
        kwargs["extra_special_tokens"] = extra
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, **kwargs)
    tok.add_special_tokens({"additional_special_tokens": specials})
    return tok


def _ids(tok: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Vocabulary size and the special ids of the text model: EOS = [SEP], pad = [PAD], BOS = [CLS]."""
    return {
        "vocab_size": len(tok),
        "eos_token_id": tok.sep_token_id,
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.cls_token_id,
        **(config or {}),
    }


def _save(model: Any, processor_files: Callable[[Path], None], folder: Path, template: str) -> Path:
    """Weights (matrices a family initialises to zeros drawn at random: an image must change the answer),
    the processor's files and the chat template."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and not bool(param.any()):
                param.normal_(0.0, 0.2)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor_files(folder)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder


def _processor_config(folder: Path, cls: str, **kwargs: Any) -> None:
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": cls, **kwargs}, indent=2), encoding="utf-8"
    )


def save_llava(tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """LLaVA: a CLIP vision tower (32 x 32 images, 8 x 8 patches: 16 image tokens), a two-layer projector, Llama."""
    import torch
    import transformers

    tok = _tokenizer(tokenizer_dir, ["<image>"])
    image_id = tok.convert_tokens_to_ids("<image>")
    config = transformers.LlavaConfig(
        vision_config=dict(
            model_type="clip_vision_model",
            **_VISION,
            projection_dim=32,
        ),
        text_config=dict(model_type="llama", max_position_embeddings=512, **_ids(tok), **_TEXT),
        image_token_id=image_id,
        vision_feature_layer=-1,
        **_ids(tok),
    )
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    image = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})

    def files(out: Path) -> None:
        tok.save_pretrained(out)
        image.save_pretrained(out)
        _processor_config(
            out,
            "LlavaProcessor",
            patch_size=8,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # the CLS token, which the default strategy drops
        )

    return _save(model, files, folder, CHAT_TEMPLATE.replace("{{ IMAGE }}", "<image>"))


def save_qwen2_vl(tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """Qwen2-VL: packed 14 x 14 patches (``image_grid_thw``) merged 2 x 2, M-RoPE over (t, h, w); images resized
    to between 4 and 64 merged tokens (56 x 56 to 224 x 224 pixels)."""
    import torch
    import transformers

    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = _tokenizer(tokenizer_dir, specials)
    start, end, image_id, video_id = tok.convert_tokens_to_ids(specials)
    text = dict(
        model_type="qwen2_vl_text",
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        **_ids(tok),
        **_TEXT,
    )
    config = transformers.Qwen2VLConfig(
        text_config=text,
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=32,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=image_id,
        video_token_id=video_id,
        vision_start_token_id=start,
        vision_end_token_id=end,
        **_ids(tok),
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    image = transformers.Qwen2VLImageProcessor(
        min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28, patch_size=14, merge_size=2, temporal_patch_size=2
    )

    def files(out: Path) -> None:
        tok.save_pretrained(out)
        image.save_pretrained(out)
        _processor_config(out, "Qwen2VLProcessor")

    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    return _save(model, files, folder, CHAT_TEMPLATE.replace("{{ IMAGE }}", placeholder))


def save_idefics3(tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """Idefics3 (SmolVLM's architecture): images split into 32 x 32 crops plus a global view (up to 2 x 2 crops
    of a 64-pixel long edge), each crop 4 tokens after the pixel-shuffle connector (8 x 8 patches, scale 2)."""
    import torch
    import transformers

    specials = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    specials += [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tok = _tokenizer(tokenizer_dir, specials)
    config = transformers.Idefics3Config(
        vision_config=dict(_VISION),
        text_config=dict(model_type="llama", max_position_embeddings=512, **_ids(tok), **_TEXT),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        **_ids(tok),
    )
    torch.manual_seed(seed)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    image = transformers.Idefics3ImageProcessor(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
    )

    def files(out: Path) -> None:
        tok.save_pretrained(out)
        image.save_pretrained(out)
        _processor_config(out, "Idefics3Processor", image_seq_len=4)

    return _save(model, files, folder, CHAT_TEMPLATE.replace("{{ IMAGE }}", "<image>"))


def save_gemma3(tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """Gemma 3: a SigLIP tower (32 x 32 images, 16 patches) pooled to 4 soft tokens per image, which attend to each
    other bidirectionally (``token_type_ids``); sliding-window and global layers."""
    import torch
    import transformers

    extra = {
        "image_token": "<image_soft_token>",
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
    }
    tok = _tokenizer(tokenizer_dir, list(extra.values()), extra)
    text = dict(
        model_type="gemma3_text",
        max_position_embeddings=512,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        **_ids(tok),
        **_TEXT,
    )
    config = transformers.Gemma3Config(
        vision_config=dict(
            model_type="siglip_vision_model",
            **_VISION,
        ),
        text_config=text,
        mm_tokens_per_image=4,
        image_token_index=tok.convert_tokens_to_ids(extra["image_token"]),
        boi_token_index=tok.convert_tokens_to_ids(extra["boi_token"]),
        eoi_token_index=tok.convert_tokens_to_ids(extra["eoi_token"]),
        **_ids(tok),
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    image = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})

    def files(out: Path) -> None:
        tok.save_pretrained(out)
        image.save_pretrained(out)
        _processor_config(out, "Gemma3Processor", image_seq_length=4)

    return _save(model, files, folder, CHAT_TEMPLATE.replace("{{ IMAGE }}", "<start_of_image>"))


def save_paligemma(tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """PaliGemma: a SigLIP tower (32 x 32 images, 16 image tokens) and Gemma attending bidirectionally over the
    prefix (image + prompt) and causally over the generated suffix; no chat template (its processor puts the
    image tokens and BOS before the prompt). Text weights drawn wide (0.5) so that greedy tokens vary."""
    import torch
    import transformers

    tok = _tokenizer(tokenizer_dir, ["<image>"], {"image_token": "<image>"})
    tok.add_special_tokens({"bos_token": "[CLS]"})
    text = dict(model_type="gemma", max_position_embeddings=512, head_dim=16, initializer_range=0.5, **_TEXT)
    config = transformers.PaliGemmaConfig(
        vision_config=dict(
            model_type="siglip_vision_model",
            **_VISION,
            projection_dim=32,
        ),
        text_config={**text, **_ids(tok)},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        projection_dim=32,
        hidden_size=32,
        **_ids(tok),
    )
    torch.manual_seed(seed)
    model = transformers.PaliGemmaForConditionalGeneration(config).eval()
    image = transformers.SiglipImageProcessor(size={"height": 32, "width": 32})
    image.image_seq_length = 16  # PaliGemma's processor reads it from its image processor

    def files(out: Path) -> None:
        tok.save_pretrained(out)
        image.save_pretrained(out)
        _processor_config(out, "PaliGemmaProcessor")

    folder = _save(model, files, folder, "")
    (folder / "chat_template.jinja").unlink()
    return folder


#: family -> builder(tokenizer_dir, folder) of its tiny model folder.
VLM_FAMILIES: dict[str, Callable[[Path, Path], Path]] = {
    "llava": save_llava,
    "qwen2_vl": save_qwen2_vl,
    "idefics3": save_idefics3,
    "gemma3": save_gemma3,
    "paligemma": save_paligemma,
}
