"""Every operator of the ONNX -> torch interpreter (Tent on ONNX-only models) against ONNX Runtime, one node each."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from modelexport.testtime.tent import SUPPORTED_OPS, OnnxTorchModule

R = np.random.default_rng(0)


def _r(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


# op -> (inputs fed at run time, initializers, attributes, node input names)
CASES: dict[str, tuple[dict, dict, dict, list[str]]] = {
    "Conv": (
        {"x": _r(2, 3, 5, 5)},
        {"w": _r(4, 3, 3, 3), "b": _r(4)},
        {"pads": [1, 0, 0, 1], "strides": [1, 2]},
        ["x", "w", "b"],
    ),
    "MaxPool": (
        {"x": _r(2, 3, 5, 5)},
        {},
        {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]},
        ["x"],
    ),
    "AveragePool": (
        {"x": _r(2, 3, 6, 6)},
        {},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
        ["x"],
    ),
    "GlobalAveragePool": ({"x": _r(2, 3, 4, 4)}, {}, {}, ["x"]),
    "Gemm": (
        {"x": _r(4, 5)},
        {"w": _r(3, 5), "b": _r(3)},
        {"transB": 1, "alpha": 0.5, "beta": 2.0},
        ["x", "w", "b"],
    ),
    "MatMul": ({"x": _r(2, 4, 5)}, {"w": _r(5, 3)}, {}, ["x", "w"]),
    "Add": ({"x": _r(2, 3)}, {"y": _r(3)}, {}, ["x", "y"]),
    "Sub": ({"x": _r(2, 3)}, {"y": _r(3)}, {}, ["x", "y"]),
    "Mul": ({"x": _r(2, 3)}, {"y": _r(3)}, {}, ["x", "y"]),
    "Div": ({"x": _r(2, 3)}, {"y": np.abs(_r(3)) + 0.5}, {}, ["x", "y"]),
    "Relu": ({"x": _r(2, 3)}, {}, {}, ["x"]),
    "Sigmoid": ({"x": _r(2, 3)}, {}, {}, ["x"]),
    "Tanh": ({"x": _r(2, 3)}, {}, {}, ["x"]),
    "Softmax": ({"x": _r(2, 3)}, {}, {"axis": -1}, ["x"]),
    "ReduceMean": ({"x": _r(2, 3, 4)}, {"axes": np.array([1, 2], np.int64)}, {"keepdims": 0}, ["x", "axes"]),
    "Reshape": ({"x": _r(2, 3, 4)}, {"shape": np.array([0, -1], np.int64)}, {}, ["x", "shape"]),
    "Flatten": ({"x": _r(2, 3, 4)}, {}, {"axis": 1}, ["x"]),
    "Transpose": ({"x": _r(2, 3, 4)}, {}, {"perm": [2, 0, 1]}, ["x"]),
    "Unsqueeze": ({"x": _r(2, 3)}, {"axes": np.array([0, -1], np.int64)}, {}, ["x", "axes"]),
    "Squeeze": ({"x": _r(2, 1, 3)}, {"axes": np.array([1], np.int64)}, {}, ["x", "axes"]),
    "Concat": ({"x": _r(2, 3)}, {"y": _r(2, 2)}, {"axis": 1}, ["x", "y"]),
    "Identity": ({"x": _r(2, 3)}, {}, {}, ["x"]),
    "Dropout": ({"x": _r(2, 3)}, {}, {}, ["x"]),
    "BatchNormalization": (
        {"x": _r(4, 3, 2, 2)},
        {"s": _r(3), "bias": _r(3), "m": _r(3), "v": np.abs(_r(3)) + 0.5},
        {"epsilon": 1e-5},
        ["x", "s", "bias", "m", "v"],
    ),
    "Constant": ({}, {}, {"value": numpy_helper.from_array(_r(2, 3), "c")}, []),
}


@pytest.mark.must
def test_every_supported_operator_has_a_case() -> None:
    assert set(SUPPORTED_OPS) == set(CASES)


@pytest.mark.must
@pytest.mark.parametrize("op", list(CASES))
def test_operator_matches_onnx_runtime(op: str) -> None:
    feeds, inits, attrs, inputs = CASES[op]
    node = helper.make_node(op, inputs, ["out"], **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    with torch.no_grad():
        got = OnnxTorchModule(model, train_bn=False)(feeds)[0].numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
