"""The output folder loads in the real Hugging Face Optimum; its outputs equal ours."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelexport.inference import pipeline
from modelexport.inspect.optimum import validate_optimum_compatibility
from tests.helpers import assert_nested_close

pytestmark = pytest.mark.integration

TEXTS = ["i love this movie", "what a terrible city , john"]


def _optimum_pipeline(task: str, ort_cls: str, folder: Any) -> Any:
    import optimum.onnxruntime as ort_optimum
    import transformers

    model = getattr(ort_optimum, ort_cls).from_pretrained(str(folder))
    arg = {"image-classification": "image_processor"}.get(task, "tokenizer")
    return transformers.pipeline(task, model=model, **{arg: str(folder)})


def _image() -> Any:
    from PIL import Image

    return Image.fromarray((np.random.RandomState(0).rand(40, 50, 3) * 255).astype(np.uint8))


CASES = {
    "seq_cls": (
        "text-classification",
        "ORTModelForSequenceClassification",
        lambda: (TEXTS,),
        {"top_k": None},
    ),
    "token_cls": (
        "token-classification",
        "ORTModelForTokenClassification",
        lambda: ("john lives in paris",),
        {},
    ),
    "qa": (
        "question-answering",
        "ORTModelForQuestionAnswering",
        lambda: (),
        {"question": "where does john live ?", "context": "john lives in paris , the capital of france ."},
    ),
    "image_cls": ("image-classification", "ORTModelForImageClassification", lambda: ([_image()],), {}),
}


@pytest.mark.optimum
@pytest.mark.parametrize("name", list(CASES))
def test_optimum_loads_and_matches(task_export: Any, name: str) -> None:
    task, ort_cls, args, kwargs = CASES[name]
    folder = task_export(name).output_dir
    report = validate_optimum_compatibility(folder)
    assert report.ok, report.findings
    assert report.ort_model_class == ort_cls and report.to_dict()["processor"]["class"]
    ours = pipeline(model=folder)(*args(), **kwargs)
    theirs = _optimum_pipeline(task, ort_cls, folder)(*args(), **kwargs)
    assert_nested_close(ours, theirs)


@pytest.mark.optimum
def test_optimum_feature_extraction_minilm(minilm_export: Any) -> None:
    import torch
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    folder = minilm_export.output_dir
    report = validate_optimum_compatibility(folder)
    assert report.ok, report.findings
    model = ORTModelForFeatureExtraction.from_pretrained(str(folder))
    enc = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.numpy()
    ours = pipeline(model=folder)(TEXTS, batch_size=2, return_tensors=True)
    for i, row in enumerate(ours):
        n = int(enc["attention_mask"][i].sum())
        assert np.abs(row[0] - hidden[i, :n]).max() < 1e-4


def test_plain_torch_folder_is_reported_not_optimum_compatible(cnn_export: Any) -> None:
    report = validate_optimum_compatibility(cnn_export.output_dir)
    assert not report.ok
    assert any("config.json is missing" in f for f in report.findings)
    assert report.to_dict()["ok"] is False


@pytest.mark.optimum
def test_validate_optimum_cli(task_export: Any, cnn_export: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from modelexport.cli.app import main

    assert main(["validate", "--optimum", str(task_export("seq_cls").output_dir)]) == 0
    assert "Optimum compatible" in capsys.readouterr().out
    assert main(["validate", "--optimum", str(cnn_export.output_dir)]) == 1
    assert "config.json is missing" in capsys.readouterr().out
