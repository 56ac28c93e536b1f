"""Fixtures for the report tests: a real headless Chromium, and the tiny BERT with its int8 twin."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.report.browser import missing_reason, start_browser


@pytest.fixture(scope="session")
def browser() -> Any:
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    scratch = Path(tempfile.mkdtemp(prefix="modelexport-chromium-"))
    try:
        driver = start_browser(scratch)
        yield driver
        driver.quit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_bert_int8(tiny_bert_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT quantized (dynamic int8) through the library, tags re-written by the quantizer's passes."""
    from modelexport.optimize.config import QuantizeConfig
    from modelexport.optimize.quantization import quantize

    out = tmp_path_factory.mktemp("int8") / "model_int8.onnx"
    quantize(tiny_bert_export.onnx_path, out, QuantizeConfig(progress=False))
    return out
