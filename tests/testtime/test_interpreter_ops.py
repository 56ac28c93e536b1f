"""Every operator of the ONNX -> torch interpreter (Tent on ONNX-only models) against ONNX Runtime, one node each.

``DEFAULTS`` holds one case per operator with every optional attribute left out, so the interpreter must follow the
ONNX defaults of the opset (a default stride of 1 for pooling, Softmax's axis per opset...). ``VARIANTS`` covers
non-default attributes and the opsets where an operator's signature changed (axes as attribute or input).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from modelexport.errors import TestTimeError
from modelexport.testtime.interpreter import SUPPORTED_OPS, OnnxTorchModule

R = np.random.default_rng(0)


def _r(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def _i(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def case(
    op: str, *ins: np.ndarray | None, opset: int = 20, outputs: int = 1, id: str = "", **attrs: Any
) -> Any:
    """One node ``op`` fed ``ins`` (None: an omitted optional input) with ``attrs``, at ``opset``."""
    return pytest.param(op, list(ins), attrs, opset, outputs, id=f"{op}-{id}" if id else op)


X4 = _r(2, 3, 7, 6)  # an NCHW input whose odd sizes exercise pads, strides and ceil_mode
W = _r(4, 3, 3, 3)

DEFAULTS = [
    case("Constant", value=numpy_helper.from_array(_r(2, 3))),
    case("ConstantOfShape", _i(2, 3)),
    case("Shape", _r(2, 3, 4)),
    case("Size", _r(2, 3, 4)),
    case("Gather", _r(3, 4), _i(0, 2, -1)),
    case("Concat", _r(2, 3), _r(1, 3), axis=0),
    case("Unsqueeze", _r(2, 3), _i(0, -1)),
    case("Squeeze", _r(2, 1, 3, 1)),
    case("Reshape", _r(2, 3, 4), _i(0, -1)),
    case("Slice", _r(4, 5), _i(1), _i(100)),
    case("Cast", _r(2, 3) * 5, to=TensorProto.INT64),
    case("CastLike", _r(2, 3), _i(1)),
    case("Expand", _r(3, 1), _i(2, 3, 4)),
    case("Identity", _r(2, 3)),
    case("Dropout", _r(2, 3)),
    case("Flatten", _r(2, 3, 4)),
    case("Transpose", _r(2, 3, 4)),
    case("MatMul", _r(2, 4, 5), _r(5, 3)),
    case("Gemm", _r(4, 5), _r(5, 3), _r(3)),
    case("Add", _r(2, 3), _r(3)),
    case("Sub", _r(2, 3), _r(3)),
    case("Mul", _r(2, 3), _r(3)),
    case("Div", _r(2, 3), np.abs(_r(3)) + 0.5),
    case("Pow", np.abs(_r(2, 3)) + 0.1, _r(3)),
    case("Equal", _i(1, 2, 3), _i(1, 0, 3)),
    case("Less", _r(2, 3), _r(3)),
    case("Greater", _r(2, 3), _r(3)),
    case("Max", _r(2, 3), _r(3), _r(2, 1)),
    case("Min", _r(2, 3), _r(3), _r(2, 1)),
    case("Sum", _r(2, 3), _r(3), _r(2, 1)),
    case("Mean", _r(2, 3), _r(3), _r(2, 1)),
    case("Where", _r(2, 3) > 0, _r(2, 3), _r(3)),
    case("Relu", _r(2, 3)),
    case("Sigmoid", _r(2, 3)),
    case("Tanh", _r(2, 3)),
    case("Exp", _r(2, 3)),
    case("Log", np.abs(_r(2, 3)) + 0.1),
    case("Abs", _r(2, 3)),
    case("Neg", _r(2, 3)),
    case("Sqrt", np.abs(_r(2, 3))),
    case("Reciprocal", np.abs(_r(2, 3)) + 0.5),
    case("Erf", _r(2, 3)),
    case("Floor", _r(2, 3) * 3),
    case("Ceil", _r(2, 3) * 3),
    case("Softplus", _r(2, 3)),
    case("Not", _r(2, 3) > 0),
    case("LeakyRelu", _r(2, 3)),
    case("PRelu", _r(2, 3, 2), np.abs(_r(3, 1))),
    case("Elu", _r(2, 3)),
    case("HardSigmoid", _r(2, 3) * 4),
    case("HardSwish", _r(2, 3) * 4),
    case("Gelu", _r(2, 3)),
    case("Clip", _r(2, 3)),
    case("Softmax", _r(2, 3, 4)),
    case("LogSoftmax", _r(2, 3, 4)),
    case("ReduceMean", _r(2, 3, 4)),
    case("ReduceSum", _r(2, 3, 4)),
    case("ReduceMax", _r(2, 3, 4)),
    case("ReduceMin", _r(2, 3, 4)),
    case("GlobalAveragePool", X4),
    case("GlobalMaxPool", X4),
    case("MaxPool", X4, kernel_shape=[2, 2]),
    case("AveragePool", X4, kernel_shape=[3, 2]),
    case("Conv", X4, W),
    case("BatchNormalization", X4, _r(3), _r(3), _r(3), np.abs(_r(3)) + 0.5),
    case("Pad", _r(2, 3), _i(1, 0, 0, 2)),
]

VARIANTS = [
    case("Constant", id="float", value_float=2.5),
    case("Constant", id="ints", value_ints=[3, -1]),
    case("ConstantOfShape", _i(2, 3), id="int-value", value=numpy_helper.from_array(_i(7))),
    case("Shape", _r(2, 3, 4, 5), id="start-end", start=1, end=-1),
    case("Shape", _r(2, 3, 4, 5), id="negative-start", start=-2),
    case("Gather", _r(3, 4, 2), np.array(-1, np.int64), id="axis1-scalar", axis=1),
    case("Gather", np.array([5, 7, 9], np.int64), np.array(1, np.int64), id="scalar-of-a-vector"),
    case("Concat", _r(2, 3), _r(2, 1), _r(2, 2), id="negative-axis", axis=-1),
    case("Unsqueeze", _r(2, 3), opset=11, id="attr-axes", axes=[1, -1]),
    case("Squeeze", _r(2, 1, 3, 1), _i(1), id="input-axes"),
    case("Squeeze", _r(2, 1, 3, 1), opset=11, id="attr-axes", axes=[-1]),
    case("Reshape", _r(2, 3, 4), _i(-1, 0, 2), id="zero-copies"),
    case("Reshape", _r(2, 0, 3), _i(0, 3), id="allowzero", allowzero=1),
    case("Slice", _r(4, 5), _i(-1, 0), _i(-100, 3), _i(-1, 0), _i(-2, 1), id="axes-negative-steps"),
    case("Slice", _r(4, 5), _i(0), _i(-1), _i(1), None, id="skipped-axes-input"),
    case("Slice", _r(4, 5), opset=9, id="attrs", starts=[1, -3], ends=[3, 100], axes=[0, 1]),
    case("Cast", _i(-3, 4), id="int-to-double", to=TensorProto.DOUBLE),
    case("Expand", _r(3, 1), _i(1, 1), id="smaller-shape"),
    case("Dropout", _r(2, 3), outputs=2, id="mask"),
    case("Flatten", _r(2, 3, 4), id="axis0", axis=0),
    case("Flatten", _r(2, 3, 4), id="axis-neg", axis=-1),
    case("Transpose", _r(2, 3, 4), id="perm", perm=[2, 0, 1]),
    case("MatMul", _r(5), _r(5, 3), id="vector"),
    case(
        "Gemm", _r(5, 4), _r(3, 5), _r(4, 1), id="trans-alpha-beta", transA=1, transB=1, alpha=0.5, beta=2.0
    ),
    case("Gemm", _r(4, 5), _r(5, 3), id="no-c"),
    case("Div", _i(-7, 7, 9), _i(2, -2, 4), id="int-truncates"),
    case("LeakyRelu", _r(2, 3), id="alpha", alpha=0.3),
    case("Elu", _r(2, 3), id="alpha", alpha=0.5),
    case("HardSigmoid", _r(2, 3) * 4, id="alpha-beta", alpha=0.3, beta=0.4),
    case("Gelu", _r(2, 3), id="tanh", approximate="tanh"),
    case("Clip", _r(2, 3), np.array(-0.5, np.float32), np.array(0.5, np.float32), id="min-max"),
    case("Clip", _r(2, 3), None, np.array(0.2, np.float32), id="max-only"),
    case("Clip", _r(2, 3), opset=6, id="attrs", min=-0.1, max=0.3),
    case("Softmax", _r(2, 3, 4), opset=11, id="opset11-coerces-2d"),
    case("Softmax", _r(2, 3, 4), opset=11, id="opset11-axis2", axis=2),
    case("Softmax", _r(2, 3, 4), id="axis1", axis=1),
    case("LogSoftmax", _r(2, 3, 4), opset=11, id="opset11-coerces-2d"),
    case("ReduceMean", _r(2, 3, 4), _i(1, -1), id="axes-input-no-keepdims", keepdims=0),
    case("ReduceMean", _r(2, 3, 4), opset=13, id="attr-axes", axes=[2]),
    case("ReduceMean", _r(2, 3, 4), id="noop-empty-axes", noop_with_empty_axes=1),
    case("ReduceSum", _r(2, 3, 4), _i(0), id="axes-input"),
    case("ReduceSum", _r(2, 3, 4), opset=11, id="attr-axes", axes=[1], keepdims=0),
    case("ReduceMax", _r(2, 3, 4), _i(-1), id="axes-input"),
    case("MaxPool", X4, id="strides-asym-pads", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
    case("MaxPool", X4, id="ceil", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    case("MaxPool", X4, id="ceil-pads", kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    case("MaxPool", X4, id="dilations", kernel_shape=[2, 2], dilations=[2, 2]),
    case("MaxPool", X4, id="same-upper", kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"),
    case("MaxPool", X4, id="same-lower", kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
    case("MaxPool", _r(2, 3, 9), id="1d", kernel_shape=[3], strides=[2]),
    case("AveragePool", X4, id="pads", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
    case("AveragePool", X4, id="count-pad", kernel_shape=[3, 3], pads=[1, 0, 1, 2], count_include_pad=1),
    case("AveragePool", X4, id="ceil", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    case(
        "AveragePool",
        X4,
        id="ceil-count-pad",
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
        count_include_pad=1,
    ),
    case("AveragePool", X4, id="dilations", kernel_shape=[2, 2], dilations=[2, 1]),
    case("AveragePool", X4, id="same-upper", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    case("AveragePool", _r(1, 2, 3, 4, 5), id="3d", kernel_shape=[2, 2, 2]),
    case("Conv", X4, W, _r(4), id="bias-asym-pads-strides", pads=[1, 0, 0, 1], strides=[1, 2]),
    case("Conv", X4, W, id="dilations", dilations=[2, 1], pads=[2, 1, 2, 1]),
    case("Conv", X4, _r(6, 1, 3, 3), id="depthwise", group=3),
    case("Conv", X4, W, id="same-upper", strides=[2, 2], auto_pad="SAME_UPPER"),
    case("Conv", X4, W, id="same-lower", strides=[2, 2], auto_pad="SAME_LOWER"),
    case("Conv", X4, W, id="valid", auto_pad="VALID"),
    case("Conv", _r(2, 3, 9), _r(4, 3, 2), id="1d", strides=[2]),
    case("BatchNormalization", X4, _r(3), _r(3), _r(3), np.abs(_r(3)) + 0.5, id="epsilon", epsilon=0.1),
    case("Pad", _r(2, 3), _i(1, 0, 0, 2), np.array(1.5, np.float32), id="value"),
    case("Pad", X4, _i(0, 0, 1, 2, 0, 0, 2, 1), id="reflect", mode="reflect"),
    case("Pad", X4, _i(0, 0, 1, 2, 0, 0, 2, 1), id="edge", mode="edge"),
    case("Pad", X4, _i(1, 2, 2, 1), None, _i(-1, 2), id="axes"),
    case("Pad", _r(2, 3), opset=10, id="attrs", pads=[0, 1, 0, 2], value=-1.0),
]


def _model(op: str, ins: list[np.ndarray | None], attrs: dict[str, Any], opset: int, outputs: int) -> Any:
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(ins)]
    feeds = {n: v for n, v in zip(names, ins, strict=True) if n}
    outs = [f"out{i}" for i in range(outputs)]
    graph = helper.make_graph(
        [helper.make_node(op, names, outs, **attrs)],
        op,
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in feeds.items()
        ],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


@pytest.mark.must
def test_every_supported_operator_has_a_defaults_case() -> None:
    assert {p.values[0] for p in DEFAULTS} == set(SUPPORTED_OPS)


@pytest.mark.must
@pytest.mark.parametrize(("op", "ins", "attrs", "opset", "outputs"), DEFAULTS + VARIANTS)
def test_operator_matches_onnx_runtime(op: str, ins: list, attrs: dict, opset: int, outputs: int) -> None:
    model, feeds = _model(op, ins, attrs, opset, outputs)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    with torch.no_grad():
        got = [t.numpy() for t in OnnxTorchModule(model, train_bn=False)(feeds)]
    for ours, theirs in zip(got, expected, strict=True):
        assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.must
def test_gradients_reach_batchnorm_parameters_through_shape_ops() -> None:
    """Tent's use: BN in batch-statistics mode, then shape arithmetic, then a loss; scale and bias get gradients."""
    model, feeds = _model("BatchNormalization", [X4, _r(3), _r(3), _r(3), np.abs(_r(3)) + 0.5], {}, 20, 1)
    graph = model.graph
    graph.node.extend(
        [
            helper.make_node("Shape", ["in0"], ["n"], end=1),
            helper.make_node("Concat", ["n", "minus_one"], ["shape"], axis=0),
            helper.make_node("Reshape", ["out0", "shape"], ["flat"]),
        ]
    )
    graph.initializer.extend([numpy_helper.from_array(_i(-1), "minus_one")])
    for i in range(1, 5):  # BN parameters become initializers, as in an export
        graph.initializer.append(numpy_helper.from_array(feeds.pop(f"in{i}"), f"in{i}"))
    del graph.input[1:]
    graph.output[0].CopyFrom(onnx.ValueInfoProto(name="flat"))
    module = OnnxTorchModule(model, train_bn=True)
    out = module(feeds)[0]
    assert out.shape == (2, 3 * 7 * 6)
    out.square().sum().backward()
    assert set(module.parameters) == {"in1", "in2"}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters.values())


@pytest.mark.sanity
@pytest.mark.parametrize(
    ("op", "domain", "opset", "named"),
    [
        ("Selu", "", 20, "Selu"),
        ("Relu", "com.microsoft", 20, "com.microsoft::Relu"),
        ("Gelu", "", 18, "Gelu"),
    ],
)
def test_unsupported_operators_are_named_before_running(op: str, domain: str, opset: int, named: str) -> None:
    node = helper.make_node(op, ["x"], ["y"], domain=domain)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [onnx.ValueInfoProto(name="y")],
    )
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    with pytest.raises(TestTimeError, match=named) as info:
        OnnxTorchModule(helper.make_model(graph, opset_imports=imports))
    assert "torch_model" in info.value.hint
