"""The re-tag pass alone, on small hand-built graphs: each rule, and 100% coverage."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from modelexport.hierarchy.tags import TAG_KEY, TAG_SOURCE_KEY, set_node_tag
from modelexport.optimize.retag import retag, tag_coverage

A = "/Net/Block.0/Linear"
B = "/Net/Block.0/LayerNorm"
C = "/Net/Head"


def _model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]))


def _tagged(op: str, ins: list[str], outs: list[str], name: str, tag: str) -> onnx.NodeProto:
    node = helper.make_node(op, ins, outs, name=name)
    set_node_tag(node, tag, "scope")
    return node


def _before() -> onnx.ModelProto:
    return _model(
        [
            _tagged("MatMul", ["x", "w"], ["mm"], "mm_node", A),
            _tagged("Add", ["mm", "b"], ["lin"], "add_node", A),
            _tagged("LayerNormalization", ["lin", "g"], ["ln"], "ln_node", B),
            _tagged("Relu", ["ln"], ["y"], "head_node", C),
        ]
    )


def _tags(model: onnx.ModelProto) -> dict[str, tuple[str | None, str | None]]:
    out = {}
    for n in model.graph.node:
        props = {p.key: p.value for p in n.metadata_props}
        out[n.name] = (props.get(TAG_KEY), props.get(TAG_SOURCE_KEY))
    return out


@pytest.mark.sanity
def test_kept_nodes_keep_their_tag_even_when_props_were_dropped() -> None:
    after = _model(
        [helper.make_node(n.op_type, n.input, n.output, name=n.name) for n in _before().graph.node]
    )
    result = retag(_before(), after)
    assert _tags(after)["ln_node"] == (B, "scope")
    assert result.by_rule == {"kept": 4} and tag_coverage(after)["coverage_pct"] == 100.0


@pytest.mark.must
def test_fused_node_gets_common_ancestor_of_what_it_replaced() -> None:
    after = _model(
        [
            helper.make_node("FusedLinearNorm", ["x", "w", "b", "g"], ["ln"], name="fused_0"),
            helper.make_node("Relu", ["ln"], ["y"], name="head_node"),
        ]
    )
    result = retag(_before(), after)
    assert _tags(after)["fused_0"] == ("/Net/Block.0", "inherited")
    assert result.by_rule == {"kept": 1, "replaced": 1}


@pytest.mark.must
def test_inserted_quantization_nodes_inherit_the_node_they_serve() -> None:
    after = _model(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="x_QuantizeLinear"),
            helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["mm_int"], name="mm_node_quant"),
            helper.make_node("Cast", ["mm_int"], ["mm_f"], name="mm_int_cast"),
            helper.make_node("Mul", ["mm_f", "xs"], ["mm"], name="mm_node_quant_output_scale_mul"),
            helper.make_node("Add", ["mm", "b"], ["lin"], name="add_node"),
            helper.make_node("LayerNormalization", ["lin", "g"], ["ln"], name="ln_node"),
            helper.make_node("Relu", ["ln"], ["y"], name="head_node"),
        ]
    )
    result = retag(_before(), after)
    tags = _tags(after)
    assert all(
        tags[n][0] == A
        for n in ("x_QuantizeLinear", "mm_node_quant", "mm_int_cast", "mm_node_quant_output_scale_mul")
    )
    assert tags["mm_node_quant"][1] == "inherited"
    assert set(result.by_rule) == {"kept", "replaced", "named", "served"}
    assert result.coverage_pct == 100.0


@pytest.mark.sanity
def test_a_node_with_no_tagged_neighbour_gets_the_root_tag() -> None:
    after = _model(
        [
            *[helper.make_node(n.op_type, n.input, n.output, name=n.name) for n in _before().graph.node],
            helper.make_node("Identity", ["zz"], ["zz2"], name="island"),
        ]
    )
    result = retag(_before(), after)
    assert _tags(after)["island"][0] == "/Net"
    assert result.by_rule["root"] == 1


@pytest.mark.sanity
def test_untagged_input_leaves_the_output_alone() -> None:
    before = _model([helper.make_node("Relu", ["x"], ["y"], name="r")])
    after = _model([helper.make_node("Relu", ["x"], ["y"], name="r2")])
    result = retag(before, after)
    assert result.by_rule == {} and tag_coverage(after)["coverage_pct"] == 0.0
