"""Metadata encoding, checksum, wire-level read/rewrite, cache, and task detection (no exports needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelexport.errors import MetadataError, MetadataIntegrityError, OnnxFileError
from modelexport.metadata import (
    TASKS,
    clear_cache,
    detect_task,
    read_metadata,
    store,
    update_metadata,
    write_metadata,
)
from modelexport.metadata import schema as S
from modelexport.metadata.package import safe_join
from modelexport.metadata.tasks import _table


def _model(weights: int = 16) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(weights * weights, dtype=np.float32).reshape(weights, weights), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weights])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", weights])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    proto = _model()
    update_metadata(proto, {S.KEY_TASK: "text-classification", S.KEY_MODEL_CONFIG: {"id2label": {"0": "a"}}})
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.mark.sanity
def test_roundtrip_small_and_large_values() -> None:
    big = {"vocab": {f"token{i}": i for i in range(2000)}}  # > 10 KB as JSON
    stored = S.encode_entries({"text": "plain", "small": {"a": [1, 2]}, "big": big})
    assert stored["text"] == "plain"
    assert stored["big"].startswith("gzip+base64:")
    assert json.loads(stored[S.KEY_ENCODING])["big"] == "gzip+json"
    values, foreign = S.decode_entries({**stored, "other.tool": "x"})
    assert values == {"text": "plain", "small": {"a": [1, 2]}, "big": big}
    assert foreign == {"other.tool": "x"}


@pytest.mark.must
@pytest.mark.parametrize("key", ["small", "big", S.KEY_ENCODING])
def test_tampered_or_truncated_value_is_an_integrity_error(key: str) -> None:
    stored = S.encode_entries({"small": {"a": 1}, "big": {"x": "y" * 20000}})
    stored[key] = stored[key][: len(stored[key]) // 2]
    with pytest.raises(MetadataIntegrityError):
        S.decode_entries(stored)


@pytest.mark.sanity
def test_non_json_value_is_a_metadata_error() -> None:
    with pytest.raises(MetadataError, match="not JSON-serialisable"):
        S.encode_entries({"bad": object()})


@pytest.mark.must
def test_wire_level_read_equals_onnx_load(model_file: Path) -> None:
    loaded = {p.key: p.value for p in onnx.load(str(model_file)).metadata_props}
    from modelexport.metadata._proto import read_props

    assert dict(read_props(model_file)) == loaded
    meta = read_metadata(model_file)
    assert meta[S.KEY_TASK] == "text-classification" and meta[S.KEY_MODEL_CONFIG] == {"id2label": {"0": "a"}}


@pytest.mark.must
def test_write_metadata_keeps_graph_and_weights(model_file: Path) -> None:
    before = onnx.load(str(model_file))
    meta = write_metadata(model_file, {"modelexport.quantization": {"mode": "dynamic"}, S.KEY_TASK: None})
    after = onnx.load(str(model_file))
    assert meta["modelexport.quantization"] == {"mode": "dynamic"} and S.KEY_TASK not in meta
    assert after.graph.SerializeToString() == before.graph.SerializeToString()
    onnx.checker.check_model(after)


@pytest.mark.regression
def test_failed_write_leaves_file_untouched(model_file: Path) -> None:
    before = model_file.read_bytes()
    with pytest.raises(MetadataError):
        write_metadata(model_file, {"bad": {1, 2}})
    assert model_file.read_bytes() == before
    assert [p.name for p in model_file.parent.iterdir()] == ["model.onnx"]


@pytest.mark.sanity
def test_cache_by_path_size_mtime(model_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_cache()
    calls = []
    real = store.read_props
    monkeypatch.setattr(store, "read_props", lambda p: calls.append(p) or real(p))
    first = read_metadata(model_file)
    first["mutated"] = True  # callers get copies: the cache stays clean
    assert "mutated" not in read_metadata(model_file) and len(calls) == 1
    write_metadata(model_file, {"k": 1})
    assert read_metadata(model_file)["k"] == 1 and len(calls) >= 2


@pytest.mark.must
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_broken_files_are_onnx_file_errors(model_file: Path, damage: str) -> None:
    data = model_file.read_bytes()
    model_file.write_bytes(
        data[: len(data) // 2] if damage == "truncate" else b"this is not an onnx model at all"
    )
    clear_cache()
    with pytest.raises(OnnxFileError):
        read_metadata(model_file)


@pytest.mark.sanity
def test_model_without_metadata_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "plain.onnx"
    onnx.save(_model(), str(path))
    assert read_metadata(path) == {}


@pytest.mark.must
@pytest.mark.parametrize("name", ["../evil.txt", "/etc/passwd", "a/../../b", "C:\\x", ""])
def test_config_file_names_cannot_escape(tmp_path: Path, name: str) -> None:
    with pytest.raises(MetadataError):
        safe_join(tmp_path, name)
    assert safe_join(tmp_path, "vocab.txt") == tmp_path / "vocab.txt"


@pytest.mark.must
@pytest.mark.parametrize("task", list(TASKS))
def test_every_registered_task_is_detected_from_transformers_mappings(task: str) -> None:
    """Each task's own mapping names an architecture that detection maps to a task listing it."""
    archs = sorted(set().union(*(_table(t) for t in TASKS[task].mappings)))
    assert archs, f"{task}: its transformers mappings are empty"
    own = [a for a in archs if detect_task([a]) == task]
    assert own, f"no architecture of {task}'s mappings is detected as {task}"


@pytest.mark.must
def test_no_architecture_names_in_our_sources() -> None:
    """Task detection and pipelines use transformers' tables, never model names of ours."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    names = {n.lower() for n in CONFIG_MAPPING_NAMES if len(n) > 3} | {
        v.lower() for v in MODEL_MAPPING_NAMES.values() if isinstance(v, str)
    }
    root = Path(__file__).resolve().parents[2] / "src" / "modelexport"
    hits = []
    for folder in ("metadata", "inference", "runtime"):
        for file in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.lower() in names
                ):
                    hits.append(f"{file.name}: {node.value!r}")
    assert not hits, hits
