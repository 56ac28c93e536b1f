"""A package holds no absolute path of the machine that exported it: not the source folder, the venv, the
checkout or the home folder (the embedded config's ``_name_or_path``, the sidecar's source, the exporter's
per-node stack traces), so it can be shared as it is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import modelexport


@pytest.mark.regression
def test_no_local_path_in_any_file_of_a_package(task_source: Any, task_export: Any) -> None:
    source = Path(task_source("seq_cls")).resolve()
    result = task_export("seq_cls")  # exported from the absolute path of a local folder, with dynamo
    local = {str(source), sys.prefix, str(Path(modelexport.__file__).resolve().parents[1]), str(Path.home())}
    files = [p for p in Path(result.output_dir).rglob("*") if p.is_file()]
    assert any(p.suffix == ".onnx" for p in files) and any(p.name.endswith("_hierarchy.json") for p in files)
    for file in files:
        data = file.read_bytes()
        found = sorted(path for path in local if path.encode() in data)
        assert not found, f"{file.name} holds {found}"
    sidecar = next(p for p in files if p.name.endswith("_hierarchy.json")).read_text()
    assert f'"name_or_path": "{source.name}"' in sidecar  # the source, by its folder's name
