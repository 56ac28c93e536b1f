"""validate: clean exports pass; broken tags, drifted sidecars and bad graphs are findings; repair fixes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.cli.app import main
from modelexport.hierarchy.tags import set_node_tag
from modelexport.inspect.validate import repair, validate


@pytest.fixture()
def export_copy(tiny_bert_export: Any, tmp_path: Path) -> Path:
    """A private copy of the tiny BERT export folder (tests below modify it)."""
    return Path(shutil.copytree(tiny_bert_export.output_dir, tmp_path / "copy"))


def _retag(path: Path, index: int, tag: str) -> str:
    proto = onnx.load(str(path), load_external_data=False)  # external data stays where it is
    node = proto.graph.node[index]
    set_node_tag(node, tag)
    onnx.save(proto, str(path))
    return node.name


@pytest.mark.must
def test_clean_export_is_valid(tiny_bert_export: Any, capsys: Any) -> None:
    report = validate(tiny_bert_export.onnx_path, check_consistency=True)
    assert report.ok and report.findings == []
    assert main(["validate", str(tiny_bert_export.onnx_path), "--check-consistency"]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.must
def test_malformed_tag_and_orphan(export_copy: Path, capsys: Any) -> None:
    model = export_copy / "model.onnx"
    _retag(model, 3, "BertModel//bad tag")
    _retag(model, 4, "/Other/Root")
    report = validate(model)
    messages = [f.message for f in report.findings]
    assert not report.ok
    assert any("malformed tag" in m for m in messages) and any("2 root modules" in m for m in messages)
    assert any("not a module of the sidecar" in m for m in messages)
    assert main(["validate", str(model), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


@pytest.mark.must
def test_consistency_drift_then_repair_nodes(export_copy: Path, capsys: Any) -> None:
    model = export_copy / "model.onnx"
    name = _retag(model, 10, "/BertModel/BertPooler")
    report = validate(model, check_consistency=True)
    assert any(name in f.message and f.check == "consistency" for f in report.findings)
    assert validate(model).ok  # without the sidecar comparison the tag itself is well-formed
    fixed = repair(model, direction="nodes")
    assert len(fixed.changes) == 1 and name in fixed.changes[0]
    assert validate(model, check_consistency=True).ok
    assert repair(model, direction="nodes").changes == []


@pytest.mark.sanity
def test_repair_sidecar_from_nodes_via_cli(export_copy: Path, capsys: Any) -> None:
    model = export_copy / "model.onnx"
    name = _retag(model, 10, "/BertModel/BertPooler")
    assert main(["validate", str(model), "--repair", "--trust", "nodes"]) == 0
    out = capsys.readouterr().out
    assert "sidecar node" in out and name in out
    assert (
        json.loads((export_copy / "model_hierarchy.json").read_text())["nodes"][name]["tag"]
        == "/BertModel/BertPooler"
    )


@pytest.mark.sanity
def test_checker_failure_is_a_finding(export_copy: Path) -> None:
    model = export_copy / "model.onnx"
    proto = onnx.load(str(model))
    proto.graph.node[5].input[0] = "no_such_tensor"
    onnx.save(proto, str(model))
    report = validate(model)
    assert [f.check for f in report.findings] == ["onnx_checker"]


@pytest.mark.optimum
@pytest.mark.integration
def test_optimum_option(tiny_bert_export: Any, capsys: Any) -> None:
    pytest.importorskip("optimum.onnxruntime", reason="Optimum is an optional extra")
    rc = main(["validate", "--optimum", str(tiny_bert_export.output_dir), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == (0 if data["ok"] else 1) and isinstance(data["ok"], bool)


@pytest.mark.sanity
def test_repair_keeps_external_data_external(tiny_bert_export: Any, tmp_path: Path) -> None:
    shutil.copy(tiny_bert_export.hierarchy_path, tmp_path / "model_hierarchy.json")
    model = tmp_path / "model.onnx"
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    onnx.save(proto, str(model), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    name = _retag(model, 10, "/BertModel/BertPooler")
    fixed = repair(model, direction="nodes")
    assert len(fixed.changes) == 1 and name in fixed.changes[0]
    saved = onnx.load(str(model), load_external_data=False)
    assert all(i.data_location == onnx.TensorProto.EXTERNAL for i in saved.graph.initializer)  # not inlined
    assert validate(model, check_consistency=True).ok
