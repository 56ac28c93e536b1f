"""analyze: counts per module add up, filters and depth work, untagged models still get op statistics."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.inspect.analyze import AnalyzeConfig, analyze


@pytest.mark.must
def test_module_counts_add_up(tiny_bert_export: Any) -> None:
    a = analyze(tiny_bert_export.onnx_path)
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    assert a.total_nodes == len(proto.graph.node) and a.tagged_pct == 100.0 and not a.untagged
    root = a.modules[0]
    assert root.tag == "/BertModel" and root.total_nodes == a.total_nodes
    assert (
        root.total_parameters
        == a.parameters
        == sum(int(__import__("numpy").prod(i.dims)) for i in proto.graph.initializer)
    )
    by_tag = {m.tag: m for m in a.modules}
    layer = by_tag["/BertModel/BertEncoder/BertLayer.0"]
    children = [m for m in a.modules if m.tag.rsplit("/", 1)[0] == layer.tag]
    assert layer.total_nodes == layer.nodes + sum(c.total_nodes for c in children)
    assert layer.module_path == "encoder.layer.0" and layer.total_op_types["MatMul"] >= 4
    assert sum(m.nodes for m in a.modules) == a.total_nodes


@pytest.mark.sanity
def test_filter_and_depth(tiny_bert_export: Any) -> None:
    a = analyze(tiny_bert_export.onnx_path, AnalyzeConfig(filter_tag="*BertLayer.1*"))
    assert a.modules and all("BertLayer.1" in m.tag for m in a.modules)
    assert {m.depth for m in analyze(tiny_bert_export.onnx_path, depth=2).modules} == {1, 2}
    with pytest.raises(ConfigError, match="depth"):
        AnalyzeConfig(depth=0)


@pytest.mark.sanity
def test_untagged_model_still_has_op_stats(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key != TAG_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
    path = tmp_path / "plain.onnx"
    onnx.save(proto, str(path))
    a = analyze(path)
    assert not a.has_tags and a.modules == [] and sum(a.op_types.values()) == len(proto.graph.node)
    assert main(["analyze", str(path)]) == 0
    assert "no hierarchy tags" in capsys.readouterr().out


@pytest.mark.sanity
@pytest.mark.parametrize("fmt", ["summary", "detailed", "json", "csv"])
def test_cli_formats(tiny_bert_export: Any, fmt: str, capsys: Any) -> None:
    assert main(["analyze", str(tiny_bert_export.onnx_path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out)["total_nodes"] == tiny_bert_export.node_count
    elif fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        assert rows[0]["tag"] == "/BertModel" and int(rows[0]["total_nodes"]) == tiny_bert_export.node_count
    elif fmt == "detailed":
        assert len(out.strip().splitlines()) > tiny_bert_export.node_count
    else:
        assert "BertLayer.1" in out


@pytest.mark.sanity
def test_cli_output_file_format_from_extension(tiny_bert_export: Any, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    assert main(["analyze", str(tiny_bert_export.output_dir), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["tagged_nodes"] == tiny_bert_export.node_count
