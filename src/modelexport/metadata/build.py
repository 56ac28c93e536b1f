"""Build the metadata of an export from what the export knows (config, tokenizer, processor files)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import MetadataError, TaskDetectionError
from . import schema as S
from .tasks import architectures_of, detect_task, normalize_task

__all__ = [
    "build_metadata",
    "processor_config_of",
    "classify_processor_config",
    "graph_io",
    "PROCESSOR_FILES",
]

log = logging.getLogger(__name__)

#: Processor files transformers reads from a model folder (besides a tokenizer's own vocab files).
PROCESSOR_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "added_tokens.json",
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.jinja",
)
_TOKENIZER_KEYS = (
    "do_lower_case",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "model_input_names",
)


def classify_processor_config(cfg: dict[str, Any]) -> str:
    """'image_processor' or 'feature_extractor' for a transformers preprocessor config dict."""
    if "image_processor_type" in cfg or "image_mean" in cfg or "size" in cfg or "crop_size" in cfg:
        return "image_processor"
    return "feature_extractor"


def _tokenizer_section(tokenizer: Any) -> dict[str, Any]:
    init = getattr(tokenizer, "init_kwargs", {}) or {}
    section: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__}
    for key in _TOKENIZER_KEYS:
        value = getattr(tokenizer, key, init.get(key))
        if value is not None:
            section[key] = list(value) if isinstance(value, tuple) else value
    if section.get("model_max_length", 0) > 1e9:  # transformers' "no limit" sentinel
        section.pop("model_max_length")
    section["padding"] = True
    section["truncation"] = True
    section["special_tokens"] = {k: str(v) for k, v in tokenizer.special_tokens_map.items()}
    return section


def _read_preprocessor(model_dir: Path | None) -> dict[str, Any] | None:
    if model_dir is None:
        return None
    file = model_dir / "preprocessor_config.json"
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MetadataError(f"{file} is not valid JSON: {exc.msg}") from exc


def processor_config_of(
    tokenizer: Any, model_dir: Path | None, user: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``hf_processor_config`` value: one flat dict, as transformers' own processor configs are.

    The image/audio processor config (the source's ``preprocessor_config.json`` or the user's) and the
    tokenizer settings are merged; ``processor_kinds`` lists which are present, ``processor_type`` is
    the single kind or ``processor`` for several.
    """
    out: dict[str, Any] = {}
    kinds: list[str] = []
    pre = dict(user) if user else _read_preprocessor(model_dir)
    if pre:
        out.update(pre)
        kinds.append(classify_processor_config(pre))
    if tokenizer is not None:
        out.update(_tokenizer_section(tokenizer))
        kinds.insert(0, "tokenizer")
    if kinds:
        out["processor_type"] = kinds[0] if len(kinds) == 1 else "processor"
        out["processor_kinds"] = kinds
    return out


def _dims(value_info: Any) -> list[int | str]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in shape.dim]


def graph_io(model_proto: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of the graph: name, dims (int or symbolic name) and element type."""
    import onnx

    init = {t.name for t in model_proto.graph.initializer}

    def describe(v: Any) -> dict[str, Any]:
        elem = v.type.tensor_type.elem_type
        return {
            "name": v.name,
            "shape": _dims(v),
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else None,
        }

    return (
        [describe(v) for v in model_proto.graph.input if v.name not in init],
        [describe(v) for v in model_proto.graph.output],
    )


def _model_config(ctx: Any) -> dict[str, Any] | None:
    hf = ctx.loaded.hf_config
    if hf is not None:
        return json.loads(hf.to_json_string(use_diff=False))
    if ctx.loaded.source == "huggingface":
        raise MetadataError(
            f"{ctx.loaded.name_or_path}: a transformers model without a config cannot be packaged"
        )
    labels = ctx.config.id2label
    if labels:
        return {
            "id2label": {str(k): v for k, v in labels.items()},
            "label2id": {v: k for k, v in labels.items()},
        }
    return None


def _task(ctx: Any) -> str | None:
    if ctx.config.task:
        return normalize_task(ctx.config.task)
    if ctx.loaded.hf_config is None:
        ctx.notes.append(
            "plain torch model: no task embedded (pass task=... / --task so pipelines can detect it)"
        )
        return None
    try:
        return detect_task(architectures_of(ctx.loaded.module, ctx.loaded.hf_config))
    except TaskDetectionError as exc:
        ctx.notes.append(f"task not detected: {exc}")
        return None


def build_metadata(ctx: Any) -> dict[str, Any]:
    """The decoded schema-2.0 metadata for one export (see :mod:`modelexport.metadata.schema`)."""
    settings = ctx.extra.get("export_settings", {})
    inputs, outputs = graph_io(ctx.model_proto)
    values: dict[str, Any] = {
        S.KEY_VERSION: S.METADATA_VERSION,
        S.KEY_TIMESTAMP: datetime.now(timezone.utc).isoformat(timespec="seconds"),
        S.KEY_EXPORTER_VERSION: __version__,
        S.KEY_EXPORT_CONFIG: {
            "opset": settings.get("opset"),
            "exporter": ctx.config.exporter,
            "static_shapes": ctx.config.static_shapes,
            "dynamic_axes": settings.get("dynamic_axes"),
            "hierarchy_tags_enabled": True,
            "input_names": settings.get("input_names"),
            "output_names": settings.get("output_names"),
        },
        S.KEY_INPUTS: inputs,
        S.KEY_OUTPUTS: outputs,
        "modelexport.model": {"class": type(ctx.loaded.module).__name__, "source": ctx.loaded.source},
    }
    config = _model_config(ctx)
    if config is not None:
        values[S.KEY_MODEL_CONFIG] = config
    processor = processor_config_of(ctx.tokenizer, ctx.loaded.model_dir, ctx.config.processor_config)
    if processor:
        values[S.KEY_PROCESSOR_CONFIG] = processor
    task = _task(ctx)
    if task:
        values[S.KEY_TASK] = task
    return values
