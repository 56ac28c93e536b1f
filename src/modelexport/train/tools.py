"""``ONNXInferenceTool``: a deployed classifier as a ``dspy.Tool`` for any DSPy program or agent."""

from __future__ import annotations

from typing import Any

import dspy
import numpy as np

from ..errors import InferenceError, first_line
from ..inference.processors.image import to_array
from .program import ClassifierProgram

__all__ = ["ONNXInferenceTool"]


class ONNXInferenceTool(dspy.Tool):
    """Classify a text (``text: str``) or an image file (``image_path: str``) with the program's backend.

    Agents call tools with JSON-friendly arguments, so images are given as a file path, read as ``infer``
    reads it and pre-processed by the network's (the package's) image processor. Returns
    ``{"label", "confidence"}``.
    """

    program: Any = None  # a pydantic field: dspy.Tool is a pydantic model

    def __init__(self, program: ClassifierProgram, name: str | None = None, desc: str | None = None) -> None:
        labels = ", ".join(program.label_names[:10]) + (", ..." if len(program.label_names) > 10 else "")
        what = "a text" if program.input_field == "text" else "an image file"
        if program.input_field == "text":

            def classify(text: str) -> dict[str, Any]:
                return self._result(program(text=text))

        else:

            def classify(image_path: str) -> dict[str, Any]:
                return self._result(program(image=_load_image(image_path)))

        super().__init__(
            classify,
            name=name or f"classify_{program.input_field}",
            desc=desc or f"Classify {what} into one of: {labels}. Returns the label and its confidence.",
        )
        self.program = program

    @staticmethod
    def _result(prediction: dspy.Prediction) -> dict[str, Any]:
        return {"label": prediction.label, "confidence": round(float(prediction.confidence), 4)}


def _load_image(image_path: str) -> np.ndarray:
    """The file as an array, read as ``infer`` reads it; the network's processor sizes it."""
    try:
        return to_array(image_path)
    except InferenceError as exc:
        raise InferenceError(f"cannot read image {image_path!r}: {first_line(exc)}", hint=exc.hint) from exc
