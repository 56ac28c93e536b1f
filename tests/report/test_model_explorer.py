"""Model Explorer interop through its own ONNX adapter and node-data classes (ai-edge-model-explorer,
model-explorer-onnx): our hierarchy is its layer tree; our overlays load as its node data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.cli.app import main
from modelexport.hierarchy.tags import TAG_KEY

pytest.importorskip("model_explorer_onnx", reason="model-explorer-onnx not installed (modelexport[report])")


def _layers(path: Path) -> tuple[str, dict[str, str]]:
    """(graph id, node id -> namespace) as Model Explorer's ONNX adapter builds them."""
    from model_explorer_onnx.main import ONNXAdapter

    graph = ONNXAdapter().convert(str(path), {})["graphs"][0]
    return graph.id, {n.id: n.namespace for n in graph.nodes}


def _assert_layers_are_tags(path: Path) -> None:
    model = onnx.load(str(path), load_external_data=False)
    graph_id, namespaces = _layers(path)
    tags = {n.name: {p.key: p.value for p in n.metadata_props}.get(TAG_KEY) for n in model.graph.node}
    checked = 0
    for name, tag in tags.items():
        if tag and namespaces[name] != graph_id:  # the adapter moves Constants next to their users
            assert namespaces[name] == graph_id + tag, (name, namespaces[name], tag)
            checked += 1
    assert checked >= 0.8 * len(tags)
    assert any("/BertModel/BertEncoder/BertLayer.1/" in ns for ns in namespaces.values())


@pytest.mark.integration
def test_exported_quantized_and_fused_models_open_with_our_layers(
    tiny_bert_export: Any, tiny_bert_int8: Path, tmp_path: Path
) -> None:
    from modelexport.optimize.config import OptimizeConfig
    from modelexport.optimize.graph import optimize_model

    fused = tmp_path / "fused.onnx"
    optimize_model(tiny_bert_export.onnx_path, fused, OptimizeConfig.preset("O2"))
    ops = {n.op_type for n in onnx.load(str(fused)).graph.node}
    assert ops & {"Attention", "SkipLayerNormalization", "MultiHeadAttention"}, ops
    for path in (Path(tiny_bert_export.onnx_path), tiny_bert_int8, fused):
        _assert_layers_are_tags(path)


def _validate_overlay(path: Path, model: Path) -> dict[str, Any]:
    """Parse with Model Explorer's own node-data classes; every key must be a node id of the model."""
    from model_explorer.node_data_builder import GradientItem, GraphNodeData, ModelNodeData, NodeDataResult

    raw = json.loads(path.read_text())
    graphs = {
        gid: GraphNodeData(  # unknown keys raise TypeError: nothing outside its schema
            **{
                **g,
                "results": {k: NodeDataResult(**v) for k, v in g["results"].items()},
                "gradient": [GradientItem(**item) for item in g["gradient"]],
            }
        )
        for gid, g in raw.items()
    }
    again = json.loads(ModelNodeData(graphsData=graphs).to_json_string())
    assert {gid: {k: again[gid][k] for k in g} for gid, g in raw.items()} == raw
    graph_id, namespaces = _layers(model)
    assert list(raw) == [graph_id]
    results = raw[graph_id]["results"]
    assert results and set(results) <= set(namespaces)
    assert all(isinstance(v["value"], float) and v["value"] >= 0 for v in results.values())
    return results


@pytest.mark.integration
def test_profile_node_data(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "time.json"
    model = Path(tiny_bert_export.onnx_path)
    assert main(["profile", str(model), "--runs", "2", "--format", "json", "--node-data", str(out)]) == 0
    profiled = json.loads(capsys.readouterr().out)
    results = _validate_overlay(out, model)
    kernel = profiled["kernel_us"] - sum(profiled["unattributed"].values())
    assert sum(v["value"] for v in results.values()) <= kernel * 1.0001


@pytest.mark.integration
def test_quantize_error_node_data(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 99, (4, 8)), "attention_mask": np.ones((4, 8), np.int64)}
    feeds["token_type_ids"] = np.zeros((4, 8), np.int64)
    np.savez(tmp_path / "calib.npz", **feeds)
    out, q = tmp_path / "error.json", tmp_path / "q" / "q.onnx"  # the int8 package in a folder of its own
    args = [
        "quantize",
        str(tiny_bert_export.onnx_path),
        "-o",
        str(q),
        "--calibration-data",
        str(tmp_path / "calib.npz"),
    ]
    assert main([*args, "--error-report", "--node-data", str(out), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)["error_report"]
    results = _validate_overlay(out, q)
    assert {v["value"] for v in results.values()} <= {r["max_abs_error"] for r in report}
    assert main([*args, "--node-data", str(tmp_path / "x.json")]) == 2  # needs --error-report
    assert not (tmp_path / "x.json").exists()
