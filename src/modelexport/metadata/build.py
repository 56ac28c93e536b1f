"""Build the metadata of an export from what the export knows (config, tokenizer, processor files)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._transformers import image_processor_class, stack_versions
from .._version import __version__
from ..errors import MetadataError, TaskDetectionError
from . import schema as S
from .tasks import architectures_of, detect_task, normalize_task

if TYPE_CHECKING:
    import onnx
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

__all__ = [
    "BuiltMetadata",
    "ExportFacts",
    "ModelSource",
    "build_metadata",
    "processor_config_of",
    "classify_processor_config",
    "hf_processor",
    "processor_section",
    "complete_processor_config",
    "graph_io",
]

log = logging.getLogger(__name__)

_TOKENIZER_KEYS = (
    "do_lower_case",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "model_input_names",
)


#: Keys :func:`processor_config_of` adds for the tokenizer and the kinds; not part of an image/audio config.
_MERGE_KEYS = (*_TOKENIZER_KEYS, "tokenizer_class", "padding", "truncation", "special_tokens")
_KIND_KEYS = ("processor_type", "processor_kinds")

#: The transformers class an untyped config of each kind is read with, and the defaults it starts from
#: (an untyped image config normalises only when it gives its statistics, as before types were written).
_FALLBACK_CLASS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "image_processor": ("ViTImageProcessor", lambda cfg: {"do_normalize": "image_mean" in cfg}),
    "feature_extractor": ("Wav2Vec2FeatureExtractor", lambda cfg: {}),
}


def classify_processor_config(cfg: dict[str, Any]) -> str:
    """'image_processor' or 'feature_extractor' for a transformers preprocessor config dict."""
    if "image_processor_type" in cfg or "image_mean" in cfg or "size" in cfg or "crop_size" in cfg:
        return "image_processor"
    return "feature_extractor"


def processor_section(cfg: dict[str, Any], kind: str) -> dict[str, Any]:
    """The ``kind`` part (image_processor / feature_extractor) of an embedded ``hf_processor_config``."""
    if kind not in (cfg.get("processor_kinds") or ()):
        return {}
    drop = _KIND_KEYS + (_MERGE_KEYS if "tokenizer" in cfg["processor_kinds"] else ())
    return {k: v for k, v in cfg.items() if k not in drop}


def _hf_class(cfg: dict[str, Any], kind: str, model_type: str | None) -> tuple[type, dict[str, Any]]:
    """The slow transformers class for ``cfg`` as the Auto classes pick it: its type key, else the model type."""
    from transformers.models.auto import feature_extraction_auto as fe

    if kind == "image_processor":
        name = cfg.get("image_processor_type") or str(cfg.get("feature_extractor_type") or "").replace(
            "FeatureExtractor", "ImageProcessor"
        )
        if not name and (by_type := image_processor_class(None, model_type)) is not None:
            name = by_type.__name__
        lookup: Callable[[str], type | None] = image_processor_class
    else:
        name = cfg.get("feature_extractor_type") or fe.FEATURE_EXTRACTOR_MAPPING_NAMES.get(
            model_type or "", ""
        )
        lookup = fe.feature_extractor_class_from_name
    defaults: dict[str, Any] = {}
    if not name:
        name, make_defaults = _FALLBACK_CLASS[kind]
        defaults = make_defaults(cfg)
    cls = lookup(str(name).removesuffix("Fast"))  # PIL/numpy classes: no torchvision
    if cls is None:
        raise MetadataError(
            f"transformers has no {kind} class {name!r}",
            hint="set image_processor_type / feature_extractor_type to a transformers class name",
        )
    return cls, defaults


def hf_processor(cfg: dict[str, Any], kind: str, model_type: str | None = None) -> Any:
    """The transformers image processor / feature extractor a config describes (what AutoImageProcessor /
    AutoFeatureExtractor build from the same ``preprocessor_config.json``, slow classes only)."""
    cls, defaults = _hf_class(cfg, kind, model_type)
    try:
        return cls.from_dict({**defaults, **cfg})
    except (TypeError, ValueError, KeyError) as exc:
        raise MetadataError(f"the {kind} config does not build a {cls.__name__}: {exc}") from exc


def complete_processor_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A user's processor config as transformers writes it (class name and every setting spelled out),
    so ``AutoImageProcessor.from_pretrained(folder)`` loads the ``preprocessor_config.json`` written from it."""
    proc = hf_processor(cfg, classify_processor_config(cfg))
    return json.loads(proc.to_json_string())


def _tokenizer_section(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
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
    tokenizer: PreTrainedTokenizerBase | None, model_dir: Path | None, user: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``hf_processor_config`` value: one flat dict, as transformers' own processor configs are.

    The image/audio processor config (the source's ``preprocessor_config.json`` or the user's) and the
    tokenizer settings are merged; ``processor_kinds`` lists which are present, ``processor_type`` is
    the single kind or ``processor`` for several.
    """
    out: dict[str, Any] = {}
    kinds: list[str] = []
    pre = complete_processor_config(user) if user else _read_preprocessor(model_dir)
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


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in shape.dim]


def graph_io(model_proto: onnx.ModelProto) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of the graph: name, dims (int or symbolic name) and element type."""
    import onnx

    init = {t.name for t in model_proto.graph.initializer}

    def describe(v: onnx.ValueInfoProto) -> dict[str, Any]:
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


class ModelSource(Protocol):
    """What the metadata and the package files read of the model being exported (export's ``LoadedModel``)."""

    @property
    def module(self) -> torch.nn.Module: ...

    @property
    def source(self) -> str: ...

    @property
    def name_or_path(self) -> str | None: ...

    @property
    def model_dir(self) -> Path | None: ...

    @property
    def hf_config(self) -> PretrainedConfig | None: ...


@dataclass(frozen=True)
class ExportFacts:
    """What one export knows that its metadata records: the tagged graph, the model, the settings."""

    proto: onnx.ModelProto
    model: ModelSource
    #: The export settings record (as in the sidecar): opset, input/output names, dynamic axes.
    settings: Mapping[str, Any]
    exporter: str
    static_shapes: bool
    task: str | None = None
    id2label: Mapping[int, str] | None = None
    processor_config: dict[str, Any] | None = None
    tokenizer: PreTrainedTokenizerBase | None = None


@dataclass(frozen=True)
class BuiltMetadata:
    """The decoded metadata of one export, and what the export should tell the user about it."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()


def _model_config(facts: ExportFacts) -> dict[str, Any] | None:
    model = facts.model
    hf = model.hf_config
    if hf is not None:
        config = json.loads(hf.to_json_string(use_diff=False))
        if Path(str(config.get("_name_or_path") or "")).is_absolute():  # where the exporting machine kept it
            config.pop("_name_or_path")
        return config
    if model.source == "huggingface":
        raise MetadataError(f"{model.name_or_path}: a transformers model without a config cannot be packaged")
    labels = facts.id2label
    if labels:
        return {
            "id2label": {str(k): v for k, v in labels.items()},
            "label2id": {v: k for k, v in labels.items()},
        }
    return None


def _task(facts: ExportFacts) -> tuple[str | None, str | None]:
    """The task to embed, and a note when there is none."""
    if facts.task:
        return normalize_task(facts.task), None
    if facts.model.hf_config is None:
        return None, "plain torch model: no task embedded (pass task=... / --task so pipelines can detect it)"
    try:
        return detect_task(architectures_of(facts.model.module, facts.model.hf_config)), None
    except TaskDetectionError as exc:
        return None, f"task not detected: {exc}"


def build_metadata(facts: ExportFacts) -> BuiltMetadata:
    """The decoded schema-2.0 metadata for one export (see :mod:`modelexport.metadata.schema`)."""
    settings = facts.settings
    inputs, outputs = graph_io(facts.proto)
    values: dict[str, Any] = {
        S.KEY_VERSION: S.METADATA_VERSION,
        S.KEY_TIMESTAMP: datetime.now(timezone.utc).isoformat(timespec="seconds"),
        S.KEY_EXPORTER_VERSION: __version__,
        S.KEY_LIBRARIES: stack_versions(),
        S.KEY_EXPORT_CONFIG: {
            "opset": settings.get("opset"),
            "exporter": facts.exporter,
            "static_shapes": facts.static_shapes,
            "dynamic_axes": settings.get("dynamic_axes"),
            "hierarchy_tags_enabled": True,
            "input_names": settings.get("input_names"),
            "output_names": settings.get("output_names"),
        },
        S.KEY_INPUTS: inputs,
        S.KEY_OUTPUTS: outputs,
        "modelexport.model": {"class": type(facts.model.module).__name__, "source": facts.model.source},
    }
    config = _model_config(facts)
    if config is not None:
        values[S.KEY_MODEL_CONFIG] = config
    processor = processor_config_of(facts.tokenizer, facts.model.model_dir, facts.processor_config)
    if processor:
        values[S.KEY_PROCESSOR_CONFIG] = processor
    task, note = _task(facts)
    if task:
        values[S.KEY_TASK] = task
    return BuiltMetadata(values, (note,) if note else ())
