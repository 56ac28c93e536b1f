"""compare (structure and numbers) and profile (per-module time that adds up), on real ORT sessions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError, InputSpecError
from modelexport.inspect.compare import compare
from modelexport.inspect.profile import ProfileConfig, aggregate_events, profile


@pytest.fixture(scope="module")
def perturbed(tiny_bert_export: Any, tmp_path_factory: Any) -> Path:
    """The tiny BERT with one pooler weight shifted by 0.5 and one extra Identity in the pooler."""
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    tags = {
        n.name: {p.key: p.value for p in n.metadata_props}.get("modelexport.hierarchy_tag")
        for n in proto.graph.node
    }
    gemm = next(
        n for n in proto.graph.node if n.op_type == "Gemm" and tags[n.name] == "/BertModel/BertPooler"
    )
    weight = next(i for i in proto.graph.initializer if i.name == gemm.input[1])
    trans_b = next((a.i for a in gemm.attribute if a.name == "transB"), 0)
    arr = np.zeros(weight.dims[0] if trans_b else weight.dims[1], dtype=np.float32)
    if len(gemm.input) > 2:  # the exporter drops a zero bias; the original may also be shared: add our own
        arr += onnx.numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == gemm.input[2]))
    arr[0] += 0.5
    proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, "perturbed_bias"))
    del gemm.input[2:]
    gemm.input.append("perturbed_bias")
    out = proto.graph.output[1].name
    producer = next(n for n in proto.graph.node if out in n.output)
    producer.output[list(producer.output).index(out)] = "pre_out"
    ident = onnx.helper.make_node("Identity", ["pre_out"], [out], name="extra_identity")
    ident.metadata_props.extend(producer.metadata_props)
    proto.graph.node.append(ident)
    path = tmp_path_factory.mktemp("perturbed") / "model.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.mark.must
def test_compare_structure_and_numbers(tiny_bert_export: Any, perturbed: Path) -> None:
    same = compare(tiny_bert_export.onnx_path, tiny_bert_export.onnx_path, numeric=True)
    assert same.identical_structure and all(d["max_abs"] == 0.0 for d in same.numeric.values())
    diff = compare(tiny_bert_export.onnx_path, perturbed, numeric=True)
    assert not diff.identical_structure and diff.op_type_deltas == {"Identity": [0, 1]}
    assert diff.module_op_deltas == {"/BertModel/BertPooler": {"Identity": [0, 1]}}
    assert diff.numeric["last_hidden_state"]["max_abs"] == 0.0  # the change is after the encoder
    assert 1e-3 < diff.numeric["pooler_output"]["max_abs"] <= 0.5 + 1e-6  # tanh(x + 0.5) moves by at most 0.5


@pytest.mark.sanity
def test_compare_cli_markdown_and_json(tiny_bert_export: Any, perturbed: Path, tmp_path: Path) -> None:
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    assert main(["compare", str(tiny_bert_export.onnx_path), str(perturbed), "-o", str(md)]) == 0
    assert (
        md.read_text().startswith("# Model comparison")
        and "`/BertModel/BertPooler` | Identity | 0 | 1" in md.read_text()
    )
    assert main(["compare", str(tiny_bert_export.onnx_path), str(perturbed), "--numeric", "-o", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["a"]["nodes"] + 1 == data["b"]["nodes"] and data["numeric"]["pooler_output"]["max_abs"] > 0


@pytest.mark.must
def test_profile_times_add_up(tiny_bert_export: Any) -> None:
    r = profile(tiny_bert_export.onnx_path, ProfileConfig(runs=3, top_k=5))
    by_tag = {m.tag: m for m in r.modules}
    root = by_tag["/BertModel"]
    assert root.total_nodes == tiny_bert_export.node_count
    assert root.total_us == pytest.approx(r.kernel_us - sum(r.unattributed.values()), rel=1e-6)
    assert root.total_us == pytest.approx(sum(m.self_us for m in r.modules), rel=1e-6)
    layer = by_tag["/BertModel/BertEncoder/BertLayer.0"]
    kids = [m for m in r.modules if m.tag.rsplit("/", 1)[0] == layer.tag]
    assert (
        layer.total_us == pytest.approx(layer.self_us + sum(k.total_us for k in kids), rel=1e-6)
        and layer.total_us > 0
    )
    assert len(r.top_nodes) == 5 and r.top_nodes[0].us >= r.top_nodes[-1].us
    assert 0 < layer.share < 1


@pytest.mark.sanity
def test_aggregate_drops_warmup_and_joins_names() -> None:
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        {"cat": "Node", "name": "a_kernel_time", "ts": 10, "dur": 50, "args": {}},
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
        {"cat": "Node", "name": "a_kernel_time", "ts": 210, "dur": 7, "args": {}},
        {"cat": "Node", "name": "b/Fusion/_kernel_time", "ts": 220, "dur": 3, "args": {}},
        {"cat": "Node", "name": "whatever", "ts": 230, "dur": 2, "args": {"node_name": "Fused_9"}},
    ]
    per_node, unknown, wall = aggregate_events(events, {"a": "/M", "b": "/M/C"}, warmup=1)
    assert per_node == {"a": 7.0, "b": 3.0} and unknown == {"Fused_9": 2.0} and wall == 100.0


@pytest.mark.sanity
def test_profile_cli_json_with_npz_inputs(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    npz = tmp_path / "in.npz"
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    np.savez(npz, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    assert (
        main(
            [
                "profile",
                str(tiny_bert_export.onnx_path),
                "--runs",
                "2",
                "--inputs",
                str(npz),
                "--format",
                "json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 2 and data["modules"][0]["tag"] == "/BertModel" and data["kernel_us"] > 0
    np.savez(npz, input_ids=ids)
    with pytest.raises(InputSpecError, match="lacks inputs"):
        profile(tiny_bert_export.onnx_path, runs=1, inputs=str(npz))
    with pytest.raises(ConfigError):
        ProfileConfig(runs=0)


@pytest.mark.integration
def test_quantized_model_inspects(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    quantize = pytest.importorskip("modelexport.optimize.quantization", reason="optimize not available")
    from modelexport.inspect.analyze import analyze
    from modelexport.optimize.config import QuantizeConfig

    q, _ = quantize.quantize_proto(
        onnx.load(str(tiny_bert_export.onnx_path)), QuantizeConfig(mode="dynamic", progress=False)
    )
    path = tmp_path / "q.onnx"  # no sidecar beside it: everything comes from the node tags
    onnx.save(q, str(path))
    a = analyze(path)
    assert a.tagged_pct == 100.0 and a.op_types.get("MatMulInteger", 0) > 0
    r = profile(path, runs=1)
    assert {m.tag for m in r.modules} >= {"/BertModel/BertEncoder/BertLayer.0"}
    assert main(["validate", str(path)]) == 0
    c = compare(tiny_bert_export.onnx_path, path, numeric=True)
    assert 0 < c.numeric["last_hidden_state"]["max_abs"] < 0.5


@pytest.mark.must
def test_profile_attributes_ort_fused_nodes(tiny_bert_export: Any) -> None:
    r = profile(tiny_bert_export.onnx_path, runs=2, optimization="all")
    # fusions (SkipLayerNormalization, BiasGelu) map back to modules through the tensors they write
    assert r.ort_created and not r.unattributed
    root = next(m for m in r.modules if m.tag == "/BertModel")
    assert root.total_us == pytest.approx(r.kernel_us, rel=1e-6)
    norms = [m for m in r.modules if m.tag.endswith("BertSelfOutput/LayerNorm")]
    assert len(norms) == 2 and all(m.self_us > 0 for m in norms)  # their LayerNorm now runs fused


@pytest.mark.sanity
def test_module_numeric_locates_int8_error_per_boundary(tiny_bert_export: Any, tmp_path: Path) -> None:
    """fp32 vs int8: each module's boundary outputs differ a little; fp32 vs itself: exactly zero."""
    from modelexport import quantize
    from modelexport.inspect.compare import MODULE_DEPTH, compare

    q = tmp_path / "q" / "model.onnx"
    quantize(tiny_bert_export.onnx_path, q, progress=False)
    same = compare(tiny_bert_export.onnx_path, tiny_bert_export.onnx_path, numeric=True).module_numeric
    assert same and all(d["max_abs"] == 0.0 for d in same.values())
    diff = compare(tiny_bert_export.onnx_path, q, numeric=True).module_numeric
    assert set(diff) == set(same) and all(t.count("/") <= MODULE_DEPTH for t in diff)
    assert all(0.0 < d["max_abs"] < 1.0 for d in diff.values())
