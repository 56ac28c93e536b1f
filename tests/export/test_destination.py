"""Exporting into a folder that already holds files: an earlier export's files are replaced (stale ones
removed, and the result says so), the user's own files stay, foreign model files need --overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import modelexport
from modelexport.cli.app import main
from modelexport.errors import OutputWriteError
from tests.models.torch_models import SmallCNN, mlp

_IMAGE_PROCESSOR = {"image_processor_type": "ViTImageProcessor", "size": {"height": 8, "width": 8}}


@pytest.mark.sanity
def test_reexport_replaces_the_earlier_package_and_keeps_user_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    modelexport.export(SmallCNN(), out, processor_config=_IMAGE_PROCESSOR, with_report=True)
    assert (out / "preprocessor_config.json").is_file() and (out / "export_report.md").is_file()
    (out / "notes.txt").write_text("mine")
    result = modelexport.export(mlp(), out)
    assert not (out / "preprocessor_config.json").exists()  # the CNN's processor would mix with the MLP
    assert not (out / "export_report.md").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert any("replaced the earlier export" in n and "preprocessor_config.json" in n for n in result.notes)
    assert [i.name for i in onnx.load(str(out / "model.onnx")).graph.input] == ["input"]
    files = json.loads((out / "model_hierarchy.json").read_text())["export"]["package_files"]
    assert "model.onnx" in files and "preprocessor_config.json" not in files


@pytest.mark.sanity
def test_foreign_model_files_need_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"someone else's model")
    (out / "tokenizer.json").write_text("{}")
    with pytest.raises(OutputWriteError, match="did not write: model.onnx, tokenizer.json") as info:
        modelexport.export(mlp(), out)
    assert "--overwrite" in info.value.hint
    assert (out / "model.onnx").read_bytes() == b"someone else's model"  # refused before any work
    assert main(["export", "tests/models/torch_models.py:mlp", str(out), "--overwrite"]) == 0
    assert not (out / "tokenizer.json").exists()
    onnx.checker.check_model(str(out / "model.onnx"))
    assert "replaced" in capsys.readouterr().out
