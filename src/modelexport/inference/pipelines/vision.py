"""Image and audio tasks: classification (top-k labels, ranked) and object detection, in transformers' formats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import MetadataError
from ..processors import to_array
from .base import ClassificationMixin, ONNXPipeline, register_pipeline

if TYPE_CHECKING:
    from transformers import BaseImageProcessor

__all__ = ["ImageClassificationPipeline", "AudioClassificationPipeline", "ObjectDetectionPipeline"]


class _Classifier(ClassificationMixin, ONNXPipeline):
    default_function: str | None = None
    takes_feeds = True

    def run_batch(
        self,
        items: list[Any],
        top_k: int | None = 5,
        function_to_apply: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        feeds = self.processor(**{self.processor.modality: items})
        return self.run_feeds(feeds, top_k, function_to_apply)

    def run_feeds(
        self,
        feeds: dict[str, np.ndarray],
        top_k: int | None = 5,
        function_to_apply: str | None = None,
        **kwargs: object,
    ) -> list[Any]:
        probs = self.feed_probabilities(feeds, function_to_apply or self.default_function)
        k = min(top_k, probs.shape[-1]) if top_k is not None else None
        return [self.ranked(row, k) for row in probs]


@register_pipeline("image-classification")
class ImageClassificationPipeline(_Classifier):
    """``[{'label', 'score'}, ...]`` (top 5) per image: PIL images, file paths or arrays."""

    processor_kinds = ("image_processor",)
    processor_arg = "image_processor"


@register_pipeline("audio-classification")
class AudioClassificationPipeline(_Classifier):
    """``[{'score', 'label'}, ...]`` (top 5) per waveform or .wav file."""

    processor_kinds = ("feature_extractor",)
    processor_arg = "feature_extractor"
    default_function = "softmax"

    def ranked(self, row: np.ndarray, top_k: int | None) -> list[dict[str, Any]]:
        return [{"score": d["score"], "label": d["label"]} for d in super().ranked(row, top_k)]


@register_pipeline("object-detection")
class ObjectDetectionPipeline(ONNXPipeline):
    """``[{'score', 'label', 'box': {xmin, ymin, xmax, ymax}}]`` per image, boxes in the image's own pixels.

    Boxes are decoded by the post-processing of the transformers image processor named in the config
    (``image_processor_type``), so each detector family keeps its own decoding.
    """

    processor_kinds = ("image_processor",)
    processor_arg = "image_processor"

    def _decoder(self) -> BaseImageProcessor:
        import transformers

        name = self.processor.config.get("image_processor_type")
        cls = getattr(transformers, str(name), None) if name else None
        if cls is None or not hasattr(cls, "post_process_object_detection"):
            raise MetadataError(
                f"object detection needs an image_processor_type with box decoding, got {name!r}"
            )
        return cls.from_dict(
            {k: v for k, v in self.processor.config.items() if not k.startswith("processor_")}
        )

    def run_batch(self, items: list[Any], threshold: float = 0.5, **kwargs: object) -> list[Any]:
        import torch
        from transformers.utils import ModelOutput

        sizes = [to_array(item).shape[:2] for item in items]
        outputs = self.forward(self.processor(images=items))
        decoded = ModelOutput(
            {k: torch.from_numpy(np.asarray(v)) for k, v in outputs.items() if k in ("logits", "pred_boxes")}
        )
        raw = self._decoder().post_process_object_detection(decoded, threshold, torch.tensor(sizes))
        results = []
        for found in raw:
            boxes = [
                dict(zip(("xmin", "ymin", "xmax", "ymax"), b.int().tolist(), strict=True))
                for b in found["boxes"]
            ]
            labels = [self.label(int(i)) for i in found["labels"]]
            results.append(
                [
                    {"score": s, "label": lab, "box": b}
                    for s, lab, b in zip(found["scores"].tolist(), labels, boxes, strict=True)
                ]
            )
        return results
