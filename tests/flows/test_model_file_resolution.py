"""One rule for which .onnx file a path means, used by every command (unit level)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from modelexport.errors import ModelFileNotFoundError, OnnxFileError
from modelexport.onnxfile import (
    PACKAGE_MANIFEST,
    load_onnx,
    read_sidecar,
    record_deployed_model,
    resolve_model_path,
)


@pytest.fixture()
def package(tiny_bert_export: Any, tmp_path: Path) -> Path:
    folder = tmp_path / "pkg"
    folder.mkdir()
    shutil.copy(tiny_bert_export.onnx_path, folder / "model.onnx")
    return folder


@pytest.mark.smoke
def test_folder_means_model_onnx_then_the_only_file(package: Path) -> None:
    assert resolve_model_path(package) == package / "model.onnx"
    (package / "model.onnx").rename(package / "clf.onnx")
    assert resolve_model_path(package) == package / "clf.onnx"


@pytest.mark.smoke
def test_recorded_deployed_model_wins(package: Path) -> None:
    shutil.copy(package / "model.onnx", package / "model_dynamic.onnx")
    record_deployed_model(package, "model_dynamic.onnx")
    assert resolve_model_path(package) == package / "model_dynamic.onnx"
    assert json.loads((package / PACKAGE_MANIFEST).read_text())["deployed_model"] == "model_dynamic.onnx"


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("setup", "error", "message"),
    [
        ("two_files", OnnxFileError, r"holds 2 \.onnx files \(a\.onnx, b\.onnx\)"),
        ("empty_folder", ModelFileNotFoundError, "no .onnx file"),
        ("missing_deployed", ModelFileNotFoundError, "names gone.onnx as the deployed model"),
        ("deployed_outside", OnnxFileError, "must be a file name in the folder"),
        ("broken_manifest", OnnxFileError, "is not valid JSON"),
    ],
)
def test_ambiguous_or_broken_folders_are_errors(
    package: Path, setup: str, error: type[Exception], message: str
) -> None:
    model = package / "model.onnx"
    if setup == "two_files":
        shutil.copy(model, package / "a.onnx")
        model.rename(package / "b.onnx")
    elif setup == "empty_folder":
        model.unlink()
    elif setup == "missing_deployed":
        (package / PACKAGE_MANIFEST).write_text(json.dumps({"deployed_model": "gone.onnx"}))
    elif setup == "deployed_outside":
        (package / PACKAGE_MANIFEST).write_text(json.dumps({"deployed_model": "../model.onnx"}))
    else:
        (package / PACKAGE_MANIFEST).write_text("{not json")
    with pytest.raises(error, match=message):
        resolve_model_path(package)


@pytest.mark.smoke
def test_missing_path_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ONNX model not found"):
        load_onnx(tmp_path / "nope.onnx")


@pytest.mark.smoke
def test_one_non_onnx_file_gets_one_message_everywhere(tmp_path: Path) -> None:
    """Loading, metadata reading, sessions and inspection all report a text file the same way."""
    from modelexport.inspect import load_tagged_model
    from modelexport.metadata import read_metadata
    from modelexport.runtime.session import create_session

    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n" * 20)
    messages = set()
    for call in (
        lambda: load_onnx(bad),
        lambda: load_onnx(bad, weights=False),
        lambda: load_tagged_model(bad),
    ):
        with pytest.raises(OnnxFileError) as info:
            call()
        messages.add(str(info.value).split(" (")[0])
    assert messages == {f"{bad} is not an ONNX model or is truncated/corrupted"}
    with pytest.raises(OnnxFileError, match="not an ONNX model"):
        read_metadata(bad)
    with pytest.raises(OnnxFileError):
        create_session(bad)


@pytest.mark.smoke
def test_broken_sidecar_is_an_error_everywhere(package: Path) -> None:
    """A present but broken sidecar is never silently ignored; a missing one is None."""
    from modelexport.errors import MetadataError

    assert read_sidecar(package / "model.onnx") is None
    (package / "model_hierarchy.json").write_text("{broken")
    with pytest.raises(MetadataError, match="not valid JSON"):
        read_sidecar(package / "model.onnx")


@pytest.mark.smoke
def test_external_data_outside_the_folder_is_refused(tiny_bert_export: Any, tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(tiny_bert_export.onnx_path))
    inside = tmp_path / "inside"
    inside.mkdir()
    onnx.save_model(model, str(inside / "model.onnx"), save_as_external_data=True, location="w.data")
    assert len(load_onnx(inside).graph.initializer) == len(model.graph.initializer)
    escaped = onnx.load(str(inside / "model.onnx"), load_external_data=False)
    for tensor in escaped.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../w.data"
    shutil.copy(inside / "w.data", tmp_path / "w.data")
    onnx.save_model(escaped, str(inside / "model.onnx"))
    from modelexport.runtime.session import create_session

    for load in (load_onnx, lambda p: load_onnx(p, weights=False), create_session):
        with pytest.raises(OnnxFileError, match="outside the model's folder"):
            load(inside)
