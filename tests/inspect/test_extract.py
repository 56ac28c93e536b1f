"""extract_module_subgraph: boundary, standalone model, and the proof against PyTorch (R13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from modelexport.errors import ModuleNotInGraphError, TagError
from modelexport.hierarchy.graph import GraphIndex
from modelexport.inspect.extract import extract_module_subgraph
from tests.inspect.conftest import intermediate_values, prove, run_subgraph, spec_inputs


@pytest.mark.must
@pytest.mark.parametrize("call", [0, 1])
def test_module_called_twice_each_call_matches_torch(reuse_export: Any, call: int) -> None:
    module, export = reuse_export
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    sub, worst = prove(module, module.block, {"x": x}, export.onnx_path, "block", call=call)
    assert (sub.call_index, sub.call_count) == (call, 2)
    assert len(sub.operations) == 4 and worst <= 1e-4
    assert sub.notes == [f"/ReuseTwice/Block is called 2 times; extracted call {call}"]


@pytest.mark.sanity
def test_module_called_twice_all_calls_is_one_region(reuse_export: Any) -> None:
    module, export = reuse_export
    sub = extract_module_subgraph(export.onnx_path, None, "/ReuseTwice/Block", call="all")
    assert sub.external_inputs == ["x"] and len(sub.outputs) == 1 and len(sub.operations) == 8
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = module.block(module.block(x)).numpy()
    got = run_subgraph(sub, {"x": x.numpy()})[sub.outputs[0]]
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.sanity
def test_call_count_inferred_without_sidecar(reuse_export: Any) -> None:
    _, export = reuse_export
    proto = onnx.load(str(export.onnx_path))
    with_sidecar = extract_module_subgraph(export.onnx_path, None, "/ReuseTwice/Block", call=1)
    tags_only = extract_module_subgraph(proto, None, "/ReuseTwice/Block", call=1)
    assert tags_only.call_count == 2 and tags_only.module_path is None
    assert (tags_only.external_inputs, tags_only.outputs) == (
        with_sidecar.external_inputs,
        with_sidecar.outputs,
    )


@pytest.mark.sanity
def test_call_out_of_range_is_a_tag_error(reuse_export: Any) -> None:
    with pytest.raises(TagError, match="out of range"):
        extract_module_subgraph(reuse_export[1].onnx_path, None, "block", call=2)


@pytest.mark.must
@pytest.mark.parametrize("path", ["features.0", "features.2"])
def test_cnn_block_matches_torch(cnn_bn_export: Any, path: str) -> None:
    from tests.models.torch_models import SmallCNN

    torch.manual_seed(0)  # the fixture's seed: same weights as the export
    model = SmallCNN().eval()
    sub, worst = prove(
        model, model.get_submodule(path), spec_inputs(cnn_bn_export), cnn_bn_export.onnx_path, path
    )
    ops = {o["op_type"] for o in sub.operations}
    assert {"Conv", "BatchNormalization", "Relu"} <= ops and worst <= 1e-4


@pytest.mark.must
def test_tiny_bert_every_layer_matches_torch(tiny_bert_export: Any) -> None:
    from tests.models.hf_models import tiny_hf_model

    model = tiny_hf_model("bert")
    example = spec_inputs(tiny_bert_export)
    example["attention_mask"][1, -5:] = 0  # padding: the layers get a real 4-D mask
    for i, layer in enumerate(model.encoder.layer):
        sub, worst = prove(model, layer, example, tiny_bert_export.onnx_path, f"encoder.layer.{i}")
        assert sub.tag == f"/BertModel/BertEncoder/BertLayer.{i}" and worst <= 1e-4


@pytest.mark.sanity
def test_boundary_is_complete(tiny_bert_export: Any) -> None:
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    index = GraphIndex.build(proto)
    sub = extract_module_subgraph(proto, None, "/BertModel/BertEncoder/BertLayer.0")
    inside = {o["name"] for o in sub.operations}
    assert inside == {
        index.keys[i] for i in index.nodes_within(sub.tag)
    }  # no constants needed pulling in here
    produced_inside = {t for i, k in enumerate(index.keys) if k in inside for t in index.outputs[i]}
    assert not set(sub.external_inputs) & produced_inside
    for t in sub.outputs:  # each output is read outside the module or is a graph output
        readers = {index.keys[c] for c in index.consumers.get(t, [])}
        assert readers - inside or t in index.graph_outputs
    for t in sub.internal_tensors:
        assert {index.keys[c] for c in index.consumers.get(t, [])} <= inside
    assert set(sub.boundary_operations) <= inside
    assert {i.name for i in sub.model.graph.initializer} == set(sub.initializers)
    onnx.checker.check_model(sub.model, full_check=True)


@pytest.mark.sanity
def test_unknown_module_lists_close_matches(tiny_bert_export: Any) -> None:
    with pytest.raises(ModuleNotInGraphError, match="close matches: .*BertLayer.1"):
        extract_module_subgraph(tiny_bert_export.onnx_path, None, "BertLayr.1")


@pytest.mark.integration
def test_quantized_model_layer_still_extracts(tiny_bert_export: Any, tmp_path: Path) -> None:
    quantize = pytest.importorskip("modelexport.optimize.quantization", reason="optimize not available")
    from modelexport.optimize.config import QuantizeConfig

    proto = onnx.load(str(tiny_bert_export.onnx_path))
    q, _ = quantize.quantize_proto(proto, QuantizeConfig(mode="dynamic", progress=False))
    tag = "/BertModel/BertEncoder/BertLayer.1"
    fp = extract_module_subgraph(proto, None, tag)
    qs = extract_module_subgraph(q, None, tag)
    assert "MatMulInteger" in {o["op_type"] for o in qs.operations}
    feed = intermediate_values(
        Path(tiny_bert_export.onnx_path),
        fp.external_inputs,
        {k: v.numpy() for k, v in spec_inputs(tiny_bert_export).items()},
    )
    a, b = run_subgraph(fp, feed), run_subgraph(qs, {k: feed[k] for k in qs.external_inputs})
    out = fp.outputs[-1]
    assert 0 < float(np.abs(a[out] - b[out]).max()) < 0.25  # int8 differs, but only by quantization noise


def _hand_tagged_model() -> onnx.ModelProto:
    """x -> Add(x, c) in /M/A -> Mul(., c) in /M, with the Constant c outside /M/A and read by both."""
    from modelexport.hierarchy.tags import set_node_tag

    h = onnx.helper
    nodes = [
        h.make_node(
            "Constant", [], ["c"], name="const", value=onnx.numpy_helper.from_array(np.float32([2.0]))
        ),
        h.make_node("Add", ["x", "c"], ["a"], name="add"),
        h.make_node("Mul", ["a", "c"], ["y"], name="mul"),
    ]
    for node, tag in zip(nodes, ["/M", "/M/A", "/M"], strict=True):
        set_node_tag(node, tag, "scope")
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n"])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


@pytest.mark.regression
def test_copied_constant_is_not_an_output() -> None:
    sub = extract_module_subgraph(_hand_tagged_model(), None, "/M/A")
    assert sub.carried_constants == ["const"] and sub.external_inputs == ["x"] and sub.outputs == ["a"]
    got = run_subgraph(sub, {"x": np.float32([1.0, -3.0])})["a"]
    np.testing.assert_allclose(got, [3.0, -1.0])
