"""``ONNXAutoProcessor``: pick and build the processor a model needs, from its graph, metadata and files.

Processor kinds join a registry with a predicate over the graph inputs; the first match (in
registration order: multimodal, text, image, audio) builds the processor from the folder's processor
files (transformers' ``preprocessor_config.json``, tokenizer files) or the embedded ``hf_processor_config``,
and the graph's fixed or dynamic dims.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ..._registry import Registry
from ..._transformers import major_version, transformers_version
from ...errors import InferenceError, MetadataError
from ...metadata.build import classify_processor_config, processor_section
from ...metadata.schema import (
    CACHE_INPUT_PREFIX,
    KEY_LIBRARIES,
    KEY_MODEL_CONFIG,
    KEY_PROCESSOR_CONFIG,
    KEY_TASK,
)
from ...metadata.store import read_metadata
from ...onnxfile import resolve_model_path
from ..graph import GraphInput, graph_inputs
from .audio import ONNXFeatureExtractor
from .base import AudioInput, BaseONNXProcessor, ImageInput
from .image import ONNXImageProcessor
from .text import ONNXTokenizer, Tokenizer, load_tokenizer
from .vision_text import ONNXVisionTextProcessor

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from transformers import BaseImageProcessor, ProcessorMixin, SequenceFeatureExtractor

__all__ = [
    "DataProcessor",
    "ONNXAutoProcessor",
    "ONNXProcessor",
    "ProcessorSources",
    "PROCESSORS",
    "register_processor",
    "warn_on_version_drift",
]

log = logging.getLogger(__name__)

#: A ``data_processor`` a caller can give instead of the detected one: ours, or a transformers tokenizer,
#: processor (images + prompts), image processor or feature extractor (:meth:`ONNXAutoProcessor.wrap`).
DataProcessor: TypeAlias = (
    "BaseONNXProcessor | Tokenizer | ProcessorMixin | BaseImageProcessor | SequenceFeatureExtractor"
)


@dataclass
class ProcessorSources:
    """Everything a processor can be built from."""

    folder: Path | None
    inputs: list[GraphInput]
    processor_config: dict[str, Any]
    model_config: dict[str, Any]
    tokenizer: Tokenizer | None = None
    #: Library versions the export recorded (``modelexport.libraries``; empty for older packages).
    libraries: dict[str, str] = field(default_factory=dict)
    #: The embedded task (``hf_pipeline_task``), when there is one.
    task: str | None = None

    @property
    def model_type(self) -> str | None:
        """The transformers model type: picks the processor class of a config that names none."""
        return self.model_config.get("model_type")

    def section(self, kind: str) -> dict[str, Any]:
        """The image_processor / feature_extractor config: the folder's transformers file, else the embedded one."""
        file = self.folder / "preprocessor_config.json" if self.folder else None
        if file and file.is_file():
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise MetadataError(f"{file} is not valid JSON: {exc.msg}") from exc
            if classify_processor_config(data) == kind:
                return data
        return processor_section(self.processor_config, kind)

    def tokenizer_or_load(self) -> Tokenizer:
        return self.tokenizer if self.tokenizer is not None else load_tokenizer(self.folder)


_Predicate = Callable[[ProcessorSources], bool]
_Builder = Callable[[ProcessorSources], BaseONNXProcessor]
#: Processor kind -> (whether it fits the sources, how to build it); the first that fits wins.
PROCESSORS: Registry[tuple[_Predicate, _Builder]] = Registry("processor kind", error=MetadataError)


def register_processor(name: str, predicate: _Predicate) -> Callable[[_Builder], _Builder]:
    """Register a processor kind: ``predicate(sources)`` says whether it fits, the builder makes it."""
    return PROCESSORS.register_as(name, lambda builder: (predicate, builder))


def _has_text(s: ProcessorSources) -> bool:
    return any(i.name == "input_ids" or (i.dtype.startswith("int") and len(i.shape) == 2) for i in s.inputs)


def _has_image(s: ProcessorSources) -> bool:
    """A 4-D float input that is not a key/value cache (``past_key_values.*`` of generation graphs)."""
    return any(
        len(i.shape) == 4 and i.dtype.startswith("float") and not i.name.startswith(CACHE_INPUT_PREFIX)
        for i in s.inputs
    )


def _has_audio(s: ProcessorSources) -> bool:
    names = {i.name for i in s.inputs}
    return bool({"input_values", "input_features"} & names) or bool(s.section("feature_extractor"))


class ONNXProcessor(BaseONNXProcessor):
    """Several modalities at once (e.g. text + image): each part fills its own graph inputs."""

    kind = "processor"
    modality = "texts+images"

    def __init__(self, parts: list[BaseONNXProcessor], inputs: list[GraphInput]) -> None:
        super().__init__(inputs)
        self.parts = parts

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        given = {"texts": texts, "images": images, "audio": audio}
        feeds: dict[str, np.ndarray] = {}
        for part in self.parts:
            if given.get(part.modality) is not None:
                feeds.update(part(**{part.modality: given[part.modality]}))
        return self.cast(feeds)

    @property
    def transformers_classes(self) -> list[str]:
        return [name for part in self.parts for name in part.transformers_classes]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "parts": [p.describe() for p in self.parts]}


#: The task whose packages are run through the model's own transformers processor (images, prompts, chat template).
VISION_TEXT_TASK = "image-text-to-text"


@register_processor("image-text", lambda s: s.task == VISION_TEXT_TASK)
def _vision_text(s: ProcessorSources) -> BaseONNXProcessor:
    return ONNXVisionTextProcessor.from_folder(s.folder, s.inputs)


@register_processor("multimodal", lambda s: _has_text(s) and _has_image(s))
def _multimodal(s: ProcessorSources) -> BaseONNXProcessor:
    text_inputs = [i for i in s.inputs if len(i.shape) != 4]
    tok = ONNXTokenizer(s.tokenizer_or_load(), text_inputs, s.model_config)
    img = ONNXImageProcessor(
        [i for i in s.inputs if len(i.shape) == 4], s.section("image_processor"), model_type=s.model_type
    )
    return ONNXProcessor([tok, img], s.inputs)


@register_processor("text", _has_text)
def _text(s: ProcessorSources) -> BaseONNXProcessor:
    return ONNXTokenizer(s.tokenizer_or_load(), s.inputs, s.model_config)


@register_processor("image", _has_image)
def _image(s: ProcessorSources) -> BaseONNXProcessor:
    cfg = s.section("image_processor")
    if "num_channels" not in cfg and s.model_config.get("num_channels"):
        cfg["num_channels"] = s.model_config["num_channels"]
    return ONNXImageProcessor(s.inputs, cfg, model_type=s.model_type)


@register_processor("audio", _has_audio)
def _audio(s: ProcessorSources) -> BaseONNXProcessor:
    return ONNXFeatureExtractor(s.inputs, s.section("feature_extractor"), model_type=s.model_type)


def warn_on_version_drift(processor: BaseONNXProcessor, libraries: dict[str, str]) -> str | None:
    """Warn (and return the message) when transformers' own classes pre-process a package exported under
    another transformers major version: their behaviour changed between 4 and 5 (tokenizer options rebuilt
    or not, processor backends), so outputs may differ from the exporting machine's. Our numpy/tokenizers
    paths behave the same under every version: no warning for them."""
    exported, installed = libraries.get("transformers", ""), transformers_version()
    classes = processor.transformers_classes
    if not classes or not installed or major_version(exported) in (None, major_version(installed)):
        return None
    message = (
        f"this model was exported with transformers {exported} and transformers {installed} is installed: "
        f"{', '.join(classes)} (transformers' own class) pre-processes its inputs here, and such classes "
        f"changed between transformers {major_version(exported)} and {major_version(installed)}; compare a "
        f"few outputs with the exporting environment, or re-export with transformers {installed}"
    )
    log.warning("%s", message)
    return message


def _folder_config(folder: Path | None) -> dict[str, Any]:
    file = folder / "config.json" if folder else None
    return json.loads(file.read_text(encoding="utf-8")) if file and file.is_file() else {}


class ONNXAutoProcessor:
    """Factory: ``ONNXAutoProcessor.from_model("model.onnx")`` -> the processor this graph needs."""

    @classmethod
    def sources(
        cls,
        model: str | os.PathLike[str],
        *,
        session: InferenceSession | None = None,
        metadata: dict[str, Any] | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> ProcessorSources:
        """Graph inputs (from a session, the metadata or the file), embedded configs and the folder's files."""
        file = resolve_model_path(model)
        meta = read_metadata(file) if metadata is None else metadata
        return ProcessorSources(
            folder=file.parent,
            inputs=graph_inputs(session if session is not None else file, meta),
            processor_config=dict(meta.get(KEY_PROCESSOR_CONFIG) or {}),
            model_config=dict(meta.get(KEY_MODEL_CONFIG) or _folder_config(file.parent)),
            tokenizer=tokenizer,
            libraries=dict(meta.get(KEY_LIBRARIES) or {}),
            task=meta.get(KEY_TASK),
        )

    @classmethod
    def from_sources(cls, sources: ProcessorSources) -> BaseONNXProcessor:
        for predicate, builder in PROCESSORS.values():
            if predicate(sources):
                processor = builder(sources)
                warn_on_version_drift(processor, sources.libraries)
                return processor
        raise MetadataError(
            f"cannot tell which processor the inputs {[i.to_dict() for i in sources.inputs]} need (tried {', '.join(PROCESSORS)})",
            hint="pass data_processor=... explicitly",
        )

    @classmethod
    def from_model(cls, model: str | os.PathLike[str], **kwargs: object) -> BaseONNXProcessor:
        """The processor for ``model`` (a .onnx file or an output folder); ``kwargs`` go to :meth:`sources`."""
        return cls.from_sources(cls.sources(model, **kwargs))

    @classmethod
    def wrap(cls, processor: DataProcessor, sources: ProcessorSources) -> BaseONNXProcessor:
        """Our processor from a transformers tokenizer / image processor / feature extractor object."""
        if isinstance(processor, BaseONNXProcessor):
            return processor
        if hasattr(processor, "image_processor") and hasattr(processor, "tokenizer"):  # images + prompts
            return ONNXVisionTextProcessor(processor, sources.inputs)
        if hasattr(processor, "convert_tokens_to_ids"):
            return ONNXTokenizer(processor, sources.inputs, sources.model_config)
        to_dict = getattr(processor, "to_dict", None)
        if to_dict is None:
            raise InferenceError(
                f"data_processor of type {type(processor).__name__} is not a tokenizer or a processor"
            )
        if classify_processor_config(to_dict()) == "feature_extractor":
            return ONNXFeatureExtractor(sources.inputs, processor=processor)
        return ONNXImageProcessor(sources.inputs, processor=processor)
