"""Task detection from transformers' own auto-class mappings: no model names of ours.

Each task joins the registry with the names of the ``MODEL_FOR_*_MAPPING_NAMES`` tables of
``transformers.models.auto.modeling_auto`` that list its architectures, and the Optimum ORTModel
class that loads it. An architecture (the model's class name, or ``config.architectures``) gets the
first registered task whose tables contain it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._registry import Registry
from ..errors import TaskDetectionError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "TaskSpec",
    "TASKS",
    "get_task",
    "detect_task",
    "architectures_of",
    "normalize_task",
]


@dataclass(frozen=True)
class TaskSpec:
    """A task: transformers mapping tables that list its architectures, and Optimum's ORTModel class."""

    name: str
    mappings: tuple[str, ...]
    ort_model_class: str | None = None
    aliases: tuple[str, ...] = ()


#: Registration order is detection priority; names and aliases are matched case-insensitively.
TASKS: Registry[TaskSpec] = Registry("task", key=lambda name: str(name).strip().lower())


for _spec in (
    TaskSpec(
        "text-classification",
        ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",),
        "ORTModelForSequenceClassification",
        ("sentiment-analysis", "sequence-classification"),
    ),
    TaskSpec(
        "token-classification",
        ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",),
        "ORTModelForTokenClassification",
        ("ner",),
    ),
    TaskSpec(
        "question-answering", ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",), "ORTModelForQuestionAnswering"
    ),
    TaskSpec(
        "image-classification",
        ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
        "ORTModelForImageClassification",
    ),
    TaskSpec(
        "audio-classification",
        ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",),
        "ORTModelForAudioClassification",
    ),
    TaskSpec("object-detection", ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",), None),
    TaskSpec(
        "image-segmentation",
        ("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", "MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES"),
        "ORTModelForSemanticSegmentation",
    ),
    TaskSpec("multiple-choice", ("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",), "ORTModelForMultipleChoice"),
    TaskSpec(
        "automatic-speech-recognition",
        ("MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
        "ORTModelForCTC",
        ("automatic-speech-recognition-with-past",),
    ),
    TaskSpec(
        "image-text-to-text",
        ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
        None,
        ("image-text-to-text-with-past",),
    ),
    TaskSpec(
        "text2text-generation",
        ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",),
        "ORTModelForSeq2SeqLM",
        ("text2text-generation-with-past",),
    ),
    TaskSpec(
        "text-generation",
        ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",),
        "ORTModelForCausalLM",
        ("text-generation-with-past",),
    ),
    TaskSpec("fill-mask", ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",), "ORTModelForMaskedLM"),
    TaskSpec("feature-extraction", ("MODEL_MAPPING_NAMES",), "ORTModelForFeatureExtraction", ("default",)),
):
    TASKS.add(_spec.name, _spec, aliases=_spec.aliases)


def normalize_task(task: str) -> str:
    """The registered name for ``task`` or one of its aliases."""
    return TASKS.canonical(task)


def get_task(task: str) -> TaskSpec:
    return TASKS.get(task)


def _names_in(table: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for value in table.values():
        names.update((value,) if isinstance(value, str) else value)
    return names


def _table(name: str) -> set[str]:
    from transformers.models.auto import modeling_auto

    return _names_in(getattr(modeling_auto, name, {}) or {})


def architectures_of(
    model: object = None, config: PretrainedConfig | dict[str, Any] | None = None
) -> list[str]:
    """Candidate architecture names: the model's class, then ``config.architectures``."""
    names: list[str] = []
    if model is not None:
        names.append(type(model).__name__)
    cfg_archs = (
        getattr(config, "architectures", None)
        if not isinstance(config, dict)
        else config.get("architectures")
    )
    names.extend(a for a in cfg_archs or [] if a not in names)
    return names


def detect_task(architectures: Iterable[str]) -> str:
    """The task of the first architecture that a registered task's transformers mapping lists."""
    archs = [a for a in architectures if a]
    for arch in archs:
        for spec in TASKS.values():
            if any(arch in _table(t) for t in spec.mappings):
                return spec.name
    raise TaskDetectionError(
        f"no task found for architecture(s) {archs or '(none)'} in transformers' task mappings",
    )
