"""The numpy tail's forward and vector-Jacobian product against the torch interpreter's autograd, per operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from modelexport.testtime.backprop import GRADIENT_RULES, NumpyTail, torch_differentiable
from modelexport.testtime.interpreter import OnnxTorchModule

F = TensorProto.FLOAT
#: Each case: the operator under test fed ``h`` (the input times the trained ``w``), its extra initializers.
Case = tuple[list[onnx.NodeProto], dict[str, np.ndarray]]


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _graph(
    shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    nodes: list[onnx.NodeProto],
    inits: dict[str, Any],
    opset: int,
) -> onnx.ModelProto:
    """x (fed) times w (the trained parameter, fed) -> ``nodes`` -> y."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["h"]), *nodes],
        "case",
        [
            helper.make_tensor_value_info("x", F, list(shape)),
            helper.make_tensor_value_info("w", F, list(w_shape)),
        ],
        [helper.make_tensor_value_info("y", F, None)],
        [v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _node(op: str, inputs: list[str], output: str = "y", **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], **attrs)


rng = np.random.default_rng(0)
C = 4
CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], Callable[[], Case], int]] = {
    "BatchNormalization": (
        (3, C, 5, 5),
        (1, C, 1, 1),
        lambda: (
            [_node("BatchNormalization", ["h", "s", "b", "m", "v"], epsilon=1e-3)],
            {
                "s": rng.normal(size=C).astype(np.float32),
                "b": rng.normal(size=C).astype(np.float32),
                "m": rng.normal(size=C).astype(np.float32),
                "v": rng.uniform(0.5, 2, size=C).astype(np.float32),
            },
        ),
        17,
    ),
    "BatchNormalization (2-D)": (
        (3, C),
        (1, C),
        lambda: (
            [_node("BatchNormalization", ["h", "s", "b", "m", "v"])],
            {
                "s": rng.normal(size=C).astype(np.float32),
                "b": rng.normal(size=C).astype(np.float32),
                "m": rng.normal(size=C).astype(np.float32),
                "v": rng.uniform(0.5, 2, size=C).astype(np.float32),
            },
        ),
        17,
    ),
    "Relu": ((3, C, 5), (1, C, 1), lambda: ([_node("Relu", ["h"])], {}), 17),
    "Reshape": (
        (3, C, 2, 3),
        (1, C, 1, 1),
        lambda: ([_node("Reshape", ["h", "shape"])], {"shape": _ints("shape", [0, -1])}),
        17,
    ),
    "Flatten": ((3, C, 2, 3), (1, C, 1, 1), lambda: ([_node("Flatten", ["h"], axis=2)], {}), 17),
    "Squeeze": (
        (3, 1, C),
        (1, 1, C),
        lambda: ([_node("Squeeze", ["h", "axes"])], {"axes": _ints("axes", [1])}),
        17,
    ),
    "Unsqueeze": (
        (3, C),
        (1, C),
        lambda: ([_node("Unsqueeze", ["h", "axes"])], {"axes": _ints("axes", [-1, 1])}),
        17,
    ),
    "ReduceMean (axes attribute)": (
        (3, C, 4, 5),
        (1, C, 1, 1),
        lambda: ([_node("ReduceMean", ["h"], axes=[2, 3], keepdims=0)], {}),
        13,
    ),
    "ReduceMean (axes input)": (
        (3, C, 4, 5),
        (1, C, 1, 1),
        lambda: ([_node("ReduceMean", ["h", "axes"], keepdims=1)], {"axes": _ints("axes", [-1, 1])}),
        18,
    ),
    "ReduceMean (every axis)": ((3, C, 4, 5), (1, C, 1, 1), lambda: ([_node("ReduceMean", ["h"])], {}), 17),
    "GlobalAveragePool": ((3, C, 4, 5), (1, C, 1, 1), lambda: ([_node("GlobalAveragePool", ["h"])], {}), 17),
    "MaxPool": (
        (3, C, 5, 4),
        (1, C, 1, 1),
        lambda: ([_node("MaxPool", ["h"], kernel_shape=[2, 2], strides=[2, 2])], {}),
        17,
    ),
    "AveragePool": (
        (3, C, 4, 7),
        (1, C, 1, 1),
        lambda: ([_node("AveragePool", ["h"], kernel_shape=[2, 3], strides=[2, 3])], {}),
        17,
    ),
    "Gemm": (
        (3, C),
        (1, C),
        lambda: (
            [_node("Gemm", ["h", "B", "c"], transB=1, alpha=0.5, beta=2.0)],
            {"B": rng.normal(size=(6, C)).astype(np.float32), "c": rng.normal(size=6).astype(np.float32)},
        ),
        17,
    ),
    "Gemm (transA)": (
        (C, 3),
        (C, 1),
        lambda: ([_node("Gemm", ["h", "B"], transA=1)], {"B": rng.normal(size=(C, 2)).astype(np.float32)}),
        17,
    ),
    "MatMul": (
        (2, 3, C),
        (1, 1, C),
        lambda: ([_node("MatMul", ["h", "B"])], {"B": rng.normal(size=(C, 5)).astype(np.float32)}),
        17,
    ),
    "Add": (
        (3, C),
        (1, C),
        lambda: ([_node("Add", ["h", "k"])], {"k": rng.normal(size=C).astype(np.float32)}),
        17,
    ),
    "Sub": (
        (3, C),
        (1, C),
        lambda: ([_node("Sub", ["k", "h"])], {"k": rng.normal(size=(3, 1)).astype(np.float32)}),
        17,
    ),
    "Mul": ((3, C), (1, C), lambda: ([_node("Mul", ["h", "h"])], {}), 17),
    "Div": (
        (3, C),
        (1, C),
        lambda: ([_node("Div", ["k", "h"])], {"k": rng.normal(size=C).astype(np.float32)}),
        17,
    ),
    "Softmax": ((3, C), (1, C), lambda: ([_node("Softmax", ["h"])], {}), 17),
    "Softmax (2-D coercion)": ((3, 2, C), (1, 1, C), lambda: ([_node("Softmax", ["h"], axis=1)], {}), 11),
    "LogSoftmax": ((3, C), (1, C), lambda: ([_node("LogSoftmax", ["h"], axis=0)], {}), 17),
    "Concat": (
        (3, C),
        (1, C),
        lambda: (
            [_node("Concat", ["h", "k", "h"], axis=1)],
            {"k": rng.normal(size=(3, 2)).astype(np.float32)},
        ),
        17,
    ),
    "Dropout, Identity": (
        (3, C),
        (1, C),
        lambda: ([_node("Dropout", ["h"], "d"), _node("Identity", ["d"])], {}),
        17,
    ),
    "shape arithmetic": (
        (3, C, 2, 2),
        (1, C, 1, 1),
        lambda: (
            [
                _node("Shape", ["h"], "s"),
                _node("Gather", ["s", "zero"], "n", axis=0),
                _node("Unsqueeze", ["n", "axes"], "n1"),
                _node("Concat", ["n1", "minus"], "target", axis=0),
                _node("Reshape", ["h", "target"]),
            ],
            {
                "zero": numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
                "axes": _ints("axes", [0]),
                "minus": _ints("minus", [-1]),
            },
        ),
        17,
    ),
}


@pytest.mark.must
@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_computes_and_differentiates_as_torch(name: str) -> None:
    """Forward and the vector-Jacobian product (a random cotangent) of a graph ``x * w -> op`` in numpy, against
    the ONNX -> torch interpreter and autograd."""
    shape, w_shape, make, opset = CASES[name]
    nodes, inits = make()
    model = _graph(shape, w_shape, nodes, inits, opset)
    x = rng.normal(size=shape).astype(np.float32)
    w = rng.normal(size=w_shape).astype(np.float32) + 2.0
    tail = NumpyTail.build(model, ["w"])
    assert tail is not None
    got, got_vjp = tail({"x": x, "w": w})
    module = OnnxTorchModule(model, train_bn=False)
    reference = torch_differentiable(lambda leaves: module({"x": torch.from_numpy(x), **leaves})[0])
    want, want_vjp = reference({"w": w})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    cotangent = rng.normal(size=want.shape)
    grad = got_vjp(cotangent)["w"]
    assert grad.shape == w.shape and np.abs(grad).sum() > 0
    np.testing.assert_allclose(grad, want_vjp(cotangent)["w"], rtol=1e-4, atol=1e-5)


@pytest.mark.must
def test_a_graph_the_rules_cannot_differentiate_is_left_to_torch() -> None:
    """An operator without a rule, a max pool whose windows overlap, shape arithmetic (no backward) that a trained
    parameter reaches, a BN in training mode: no numpy tail (the caller runs torch)."""
    x4 = (2, C, 4, 4)
    conv = _node("Conv", ["h", "k"])
    assert "Conv" not in GRADIENT_RULES.names()
    kernel = {"k": rng.normal(size=(2, C, 3, 3)).astype(np.float32)}
    assert NumpyTail.build(_graph(x4, (1, C, 1, 1), [conv], kernel, 17), ["w"]) is None
    overlapping = _node("MaxPool", ["h"], kernel_shape=[2, 2], strides=[1, 1])
    assert NumpyTail.build(_graph(x4, (1, C, 1, 1), [overlapping], {}, 17), ["w"]) is None
    gathered = _node("Gather", ["h", "i"], axis=1)
    index = {"i": _ints("i", [0, 2])}
    assert NumpyTail.build(_graph(x4, (1, C, 1, 1), [gathered], index, 17), ["w"]) is None
    assert NumpyTail.build(_graph(x4, (1, C, 1, 1), [gathered], index, 17), []) is not None  # nothing trained
    training = _node("BatchNormalization", ["h", "s", "b", "m", "v"], training_mode=1)
    stats = {k: np.ones(C, np.float32) for k in "sbmv"}
    assert NumpyTail.build(_graph(x4, (1, C, 1, 1), [training], stats, 15), ["w"]) is None


@pytest.mark.must
def test_the_methods_logit_gradients_are_their_losses_gradients() -> None:
    """Tent's mean entropy and EATA's weighted entropy of the reliable rows (the weight held constant): the
    gradients the methods step on equal autograd's of the losses written in torch."""
    from modelexport.testtime.sar import _eata_gradient, _predictions
    from modelexport.testtime.tent import entropy_gradient

    logits = rng.normal(scale=3.0, size=(16, 10))
    z = torch.tensor(logits, requires_grad=True)
    log_p = z.log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    (tent,) = torch.autograd.grad(entropy.mean(), z, retain_graph=True)
    np.testing.assert_allclose(entropy_gradient(logits), tent.numpy(), rtol=1e-9, atol=1e-12)
    keep, margin = rng.random(16) < 0.5, 0.4 * np.log(10)
    kept = torch.from_numpy(keep)
    loss = (torch.exp(margin - entropy[kept].detach()) * entropy[kept]).sum() / len(keep)
    (eata,) = torch.autograd.grad(loss, z)
    np.testing.assert_allclose(
        _eata_gradient(*_predictions(logits), keep, margin),
        eata.numpy(),
        rtol=1e-9,
        atol=1e-12,
    )
