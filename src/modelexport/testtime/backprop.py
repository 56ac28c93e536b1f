"""What a gradient method steps on: parameters in, logits and their vector-Jacobian product out, all numpy.

Tent's and sar's losses, SAM and Adam are written once, on the gradient of the loss with respect to the logits
(``tent.py``, ``sar.py``); a :data:`Differentiable` carries it back to the parameters. Two kinds:

- :func:`torch_differentiable`: a torch forward and autograd's vector-Jacobian product -- the source torch
  model, or the ONNX graph run by :class:`~.interpreter.OnnxTorchModule`: any graph the interpreter runs;
- :class:`NumpyTail`: the graph run forward and back in numpy, for a graph whose every operator has a
  :data:`GRADIENT_RULES` entry -- what a classifier's tail past its last BN layer is made of (BatchNormalization,
  an activation, a pooling or reshape, a Gemm). The memory statistics' tail step runs there (``tail.py``):
  in a stream, where ONNX Runtime's passes between steps leave torch's dispatch cold, a tail step through
  torch cost 1-2 ms on the tests' CNNs, most of what tent and sar cost above bn at batch 32
  (``benchmarks/test_time.py``). Every rule is checked against torch's autograd
  (``tests/testtime/test_backprop.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from .._numeric import log_softmax
from .._registry import Registry
from ..errors import TestTimeError
from .interpreter import OpNode, axis_index, default_opset, node_axes, op_node

if TYPE_CHECKING:
    import torch

__all__ = [
    "GRADIENT_RULES",
    "Differentiable",
    "GradientRule",
    "NumpyTail",
    "VectorJacobian",
    "torch_differentiable",
]

#: The loss's gradient with respect to the logits -> its gradient with respect to each parameter.
VectorJacobian = Callable[[np.ndarray], dict[str, np.ndarray]]
#: Parameters by name -> (the logits they give, the vector-Jacobian product at them).
Differentiable = Callable[[dict[str, np.ndarray]], tuple[np.ndarray, VectorJacobian]]

Arrays = tuple[np.ndarray, ...]
#: Per input of a node: whether a trained parameter reaches it (its cotangent is wanted).
Wanted = tuple[bool, ...]
#: (node, its inputs, its outputs, the cotangent of its first output, the inputs whose cotangents are wanted) ->
#: one cotangent per input (None: none; a rule may skip the unwanted).
Backward = Callable[[OpNode, Arrays, Arrays, np.ndarray, Wanted], list[np.ndarray | None]]


@dataclass(frozen=True)
class GradientRule:
    """An operator in numpy: ``forward(node, *inputs)`` (one array, or a tuple per output) and ``backward``;
    without one the operator is shape arithmetic, which no trained parameter may reach (only through a
    ``constant`` operator, whose output is not a function of its inputs' values); ``accepts``: the nodes the
    rule computes (None: all)."""

    forward: Callable[..., np.ndarray | Arrays]
    backward: Backward | None = None
    accepts: Callable[[OpNode], bool] | None = None
    #: Its output is no function of its inputs' values (Shape): no gradient passes it.
    constant: bool = False


#: ONNX op_type -> its numpy forward and backward.
GRADIENT_RULES: Registry[GradientRule] = Registry(
    "operator with a numpy gradient", error=TestTimeError, hint="choose the operator from the list"
)


def torch_differentiable(forward: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> Differentiable:
    """A torch ``forward`` (parameters by name -> logits) as a :data:`Differentiable`: autograd's product."""
    import torch

    def differentiable(params: dict[str, np.ndarray]) -> tuple[np.ndarray, VectorJacobian]:
        leaves = {
            k: torch.tensor(np.asarray(v), dtype=torch.float32, requires_grad=True) for k, v in params.items()
        }
        with torch.enable_grad():
            out = forward(leaves)

        def vjp(cotangent: np.ndarray) -> dict[str, np.ndarray]:
            grads = torch.autograd.grad(
                out,
                list(leaves.values()),
                torch.from_numpy(np.ascontiguousarray(cotangent, np.float32)),
                allow_unused=True,
            )
            return {
                k: np.zeros(np.shape(params[k]), np.float32) if g is None else g.numpy()
                for k, g in zip(leaves, grads, strict=True)
            }

        return out.detach().numpy(), vjp

    return differentiable


@dataclass(frozen=True)
class _Step:
    rule: GradientRule
    node: OpNode
    inputs: tuple[str, ...]


class NumpyTail:
    """A graph run forward and back in numpy (:data:`GRADIENT_RULES`); :meth:`build` is None where an operator
    has no rule, or the trained parameters reach one that has no backward. Read-only once built: one serves
    every caller."""

    def __init__(
        self, steps: list[_Step], values: dict[str, np.ndarray], output: str, wrt: tuple[str, ...]
    ) -> None:
        self._steps, self._values, self._output, self.wrt = steps, values, output, wrt
        reached = set(wrt)
        self._path: list[_Step] = []
        for step in steps:
            if not step.rule.constant and any(name in reached for name in step.inputs):
                reached.add(step.node.outputs[0])
                self._path.append(step)
        self._reached = frozenset(reached)

    @classmethod
    def build(cls, model: onnx.ModelProto, wrt: Iterable[str], fed: Iterable[str] = ()) -> NumpyTail | None:
        """The graph of ``model`` (its first output the logits), differentiable in the fed tensors ``wrt``;
        ``fed``: the initializers each call feeds anew too (what reads them is not computed once)."""
        opset = default_opset(model)
        values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        steps: list[_Step] = []
        for node in model.graph.node:
            rule = GRADIENT_RULES.find(node.op_type) if node.domain in ("", "ai.onnx") else None
            if rule is None:
                return None
            try:
                schema = onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                return None
            op = op_node(node, schema)
            if rule.accepts is not None and not rule.accepts(op):
                return None
            steps.append(_Step(rule, op, tuple(node.input)))
        used = {name for node in model.graph.node for name in node.input}
        used |= {o.name for o in model.graph.output}
        wrt = tuple(wrt)
        given = {i.name for i in model.graph.input} | set(wrt) | set(fed)
        kept = []
        for step in steps:  # constants and what they alone compute (an axes reshape): values, computed once
            if all(name in values and name not in given for name in step.inputs if name):
                out = step.rule.forward(step.node, *_inputs(values, step.inputs))
                outs = out if isinstance(out, tuple) else (out,)
                values.update((o, np.asarray(v)) for o, v in zip(step.node.outputs, outs, strict=False) if o)
            else:
                kept.append(step)
        tail = cls(kept, values, model.graph.output[0].name, wrt)
        # a node a trained parameter reaches: its gradient must flow back, from its first output
        for step in tail._path:
            if step.rule.backward is None or any(o in used for o in step.node.outputs[1:]):
                return None
        return tail

    def __call__(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, VectorJacobian]:
        """The logits from ``feeds`` (the graph's inputs and the ``wrt`` parameters), and their product."""
        env = {**self._values, **feeds}
        for step in self._steps:
            out = step.rule.forward(step.node, *_inputs(env, step.inputs))
            outs = out if isinstance(out, tuple) else (out,)
            env.update((name, value) for name, value in zip(step.node.outputs, outs, strict=False) if name)
        logits = env[self._output]

        def vjp(cotangent: np.ndarray) -> dict[str, np.ndarray]:
            grads: dict[str, np.ndarray] = {self._output: np.asarray(cotangent, logits.dtype)}
            for step in reversed(self._path):
                g = grads.pop(step.node.outputs[0], None)
                if g is None:
                    continue
                xs = _inputs(env, step.inputs)
                ys = tuple(env[name] for name in step.node.outputs if name)
                assert step.rule.backward is not None
                wanted = tuple(name in self._reached for name in step.inputs)
                for name, gi in zip(
                    step.inputs, step.rule.backward(step.node, xs, ys, g, wanted), strict=False
                ):
                    if gi is not None and name in self._reached:
                        grads[name] = grads[name] + gi if name in grads else gi
            return {k: grads[k] if k in grads else np.zeros_like(env[k]) for k in self.wrt}

        return logits, vjp


def _inputs(env: dict[str, np.ndarray], names: tuple[str, ...]) -> Arrays:
    """The named tensors, optional inputs left out at the end (an empty name in between: None)."""
    values = [env[name] if name else None for name in names]
    while values and values[-1] is None:
        values.pop()
    return tuple(values)  # type: ignore[arg-type]


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``g`` summed over the axes numpy broadcast an operand of ``shape`` along."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _reshaped(node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted) -> list[np.ndarray | None]:
    """Reshape-like operators: the cotangent in the input's shape (their other inputs are shapes or axes)."""
    return [g.reshape(xs[0].shape), *([None] * (len(xs) - 1))]


# --- shape arithmetic and reshapes --------------------------------------------------------------------------------


def _constant(node: OpNode) -> np.ndarray:
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        value = node.get(name)
        if value is not None:
            return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)
    raise TestTimeError(f"Constant {node.outputs[0]!r}: no value attribute the numpy tail reads")


def _reshape(node: OpNode, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    dims = [int(d) for d in shape.reshape(-1)]
    if not node.get("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _flatten(node: OpNode, x: np.ndarray) -> np.ndarray:
    axis = axis_index(node["axis"], x.ndim)
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _squeeze(node: OpNode, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    dims = node_axes(node, axes, 13)
    if dims is None:
        return x.reshape([d for d in x.shape if d != 1])
    drop = {axis_index(d, x.ndim) for d in dims}
    return x.reshape([d for i, d in enumerate(x.shape) if i not in drop])


def _unsqueeze(node: OpNode, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    raw = node_axes(node, axes, 13) or []
    rank = x.ndim + len(raw)
    for d in sorted(axis_index(v, rank) for v in raw):
        x = np.expand_dims(x, d)
    return x


def _shape(node: OpNode, x: np.ndarray) -> np.ndarray:
    start, end = node.get("start", 0), node.get("end")
    return np.asarray(x.shape[start:end], np.int64)


def _concat_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    axis = axis_index(node["axis"], g.ndim)
    bounds = np.cumsum([x.shape[axis] for x in xs])[:-1]
    return list(np.split(g, bounds, axis=axis))


def _dropout(node: OpNode, x: np.ndarray, *_: np.ndarray) -> np.ndarray | Arrays:
    """Identity: the methods adapt the deterministic (inference) network; the mask output is all ones."""
    return (x, np.ones(x.shape, bool)) if len(node.outputs) > 1 else x


GRADIENT_RULES.add("Constant", GradientRule(_constant))
GRADIENT_RULES.add("Shape", GradientRule(_shape, constant=True))
GRADIENT_RULES.add("Gather", GradientRule(lambda node, x, i: np.take(x, i, axis=node["axis"])))
GRADIENT_RULES.add(
    "Concat", GradientRule(lambda node, *xs: np.concatenate(xs, axis=node["axis"]), _concat_back)
)
GRADIENT_RULES.add(
    "Cast",
    GradientRule(
        lambda node, x: x.astype(onnx.helper.tensor_dtype_to_np_dtype(node["to"])),
        lambda node, xs, ys, g, wanted: [g.astype(xs[0].dtype)],
    ),
)
GRADIENT_RULES.add("Identity", GradientRule(lambda node, x: x, _reshaped))
GRADIENT_RULES.add("Dropout", GradientRule(_dropout, _reshaped))
GRADIENT_RULES.add("Reshape", GradientRule(_reshape, _reshaped))
GRADIENT_RULES.add("Flatten", GradientRule(_flatten, _reshaped))
GRADIENT_RULES.add("Squeeze", GradientRule(_squeeze, _reshaped))
GRADIENT_RULES.add("Unsqueeze", GradientRule(_unsqueeze, _reshaped))


# --- element-wise ---------------------------------------------------------------------------------------------------


#: Element-wise op -> (a, b, the output's cotangent) -> the cotangents of a and b before broadcasting.
_BINARY_BACK: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    "Add": lambda a, b, g: (g, g),
    "Sub": lambda a, b, g: (g, -g),
    "Mul": lambda a, b, g: (g * b, g * a),
    "Div": lambda a, b, g: (g / b, -g * a / (b * b)),
}


def _binary_back(op: str) -> Backward:
    def backward(
        node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
    ) -> list[np.ndarray | None]:
        a, b = xs
        ga, gb = _BINARY_BACK[op](a, b, g)
        return [_unbroadcast(ga, a.shape), _unbroadcast(gb, b.shape)]

    return backward


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer Div truncates toward zero (C semantics, as ONNX Runtime computes it)."""
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(np.result_type(a, b))
    return np.divide(a, b).astype(np.result_type(a, b), copy=False)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": _divide,
}
for _op, _fn in _BINARY.items():
    GRADIENT_RULES.add(_op, GradientRule(lambda node, a, b, fn=_fn: fn(a, b), _binary_back(_op)))
GRADIENT_RULES.add(
    "Relu", GradientRule(lambda node, x: np.maximum(x, 0), lambda node, xs, ys, g, wanted: [g * (xs[0] > 0)])
)


def _softmax_axis(node: OpNode, x: np.ndarray) -> tuple[np.ndarray, int]:
    """The input as the operator normalises it: along ``axis`` since opset 13, coerced to 2-D before."""
    if node.since >= 13:
        return x, node["axis"]
    axis = axis_index(node["axis"], x.ndim)
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), 1


def _log_softmax(node: OpNode, x: np.ndarray) -> np.ndarray:
    flat, axis = _softmax_axis(node, x)
    return log_softmax(flat, axis).astype(x.dtype, copy=False).reshape(x.shape)


def _softmax_back(log: bool) -> Backward:
    def backward(
        node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
    ) -> list[np.ndarray | None]:
        y, axis = _softmax_axis(node, ys[0])
        g = g.reshape(y.shape)
        if log:
            out = g - np.exp(y) * g.sum(axis=axis, keepdims=True)
        else:
            out = y * (g - (g * y).sum(axis=axis, keepdims=True))
        return [out.reshape(xs[0].shape)]

    return backward


GRADIENT_RULES.add("LogSoftmax", GradientRule(_log_softmax, _softmax_back(log=True)))
GRADIENT_RULES.add(
    "Softmax", GradientRule(lambda node, x: np.exp(_log_softmax(node, x)), _softmax_back(log=False))
)


# --- reductions, linear algebra, normalisation ----------------------------------------------------------------------


def _reduced(node: OpNode, x: np.ndarray, axes: np.ndarray | None) -> tuple[int, ...] | None:
    """ReduceMean's axes (None: none, the input as it is)."""
    dims = node_axes(node, axes, 18) or []
    if not dims:
        return None if node.get("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(sorted(axis_index(d, x.ndim) for d in dims))


def _mean(x: np.ndarray, dims: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """``x.mean(axis=dims)``; over trailing axes (a pooling's, an image's) as one ``einsum`` over them
    flattened: numpy's reduction over several small trailing axes costs 3-4x that (24 against 6 us at
    32 x 32 x 4 x 4)."""
    k = x.ndim - len(dims)
    if not dims or dims != tuple(range(k, x.ndim)):
        return x.mean(axis=dims, keepdims=keepdims)
    count = math.prod(x.shape[k:])
    out = np.einsum("...s->...", x.reshape(*x.shape[:k], count)) / np.asarray(count, x.dtype)
    return out.reshape(*x.shape[:k], *(1,) * len(dims)) if keepdims else out


def _channel_sum(t: np.ndarray) -> np.ndarray:
    """Per channel (axis 1) the sum of ``t`` over every other axis: over the batch first, whose rows are
    contiguous, then over the rest (5 against 21 us at 32 x 32 x 4 x 4 for numpy's reduction over all at
    once; both pairwise)."""
    return t.sum(axis=0).reshape(t.shape[1], -1).sum(axis=-1)


def _reduce_mean(node: OpNode, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    dims = _reduced(node, x, axes)
    return x if dims is None else _mean(x, dims, bool(node["keepdims"]))


def _reduce_mean_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    x = xs[0]
    dims = _reduced(node, x, xs[1] if len(xs) > 1 else None)
    if dims is None:
        return [g, None]
    kept = [1 if i in dims else d for i, d in enumerate(x.shape)]
    count = math.prod(x.shape[i] for i in dims)
    return [np.broadcast_to(g.reshape(kept) / count, x.shape), None]


def _global_average_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    x = xs[0]
    return [np.broadcast_to(g / math.prod(x.shape[2:]), x.shape)]


GRADIENT_RULES.add("ReduceMean", GradientRule(_reduce_mean, _reduce_mean_back))


def _tiles(node: OpNode) -> bool:
    """A pooling the numpy tail computes: 2-D, windows that tile the input (strides the kernel, no pads or
    dilations, floor mode) and no indices output."""
    kernel = node.get("kernel_shape") or []
    return (
        len(kernel) == 2
        and list(node.get("strides") or [1, 1]) == list(kernel)
        and not any(node.get("pads") or [])
        and all(d == 1 for d in node.get("dilations") or [1, 1])
        and not node.get("ceil_mode", 0)
        and node.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")
        and len(node.outputs) == 1
    )


def _windows(node: OpNode, x: np.ndarray) -> np.ndarray:
    """(N, C, H', W', kh * kw): each output position's window."""
    kh, kw = node["kernel_shape"]
    n, c, h, w = x.shape
    ho, wo = h // kh, w // kw
    tiles = x[:, :, : ho * kh, : wo * kw].reshape(n, c, ho, kh, wo, kw)
    return tiles.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, ho, wo, kh * kw)


def _untiled(node: OpNode, x: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """Per-window values (N, C, H', W', kh * kw) back in the input's layout (rows and columns no window
    covers: 0)."""
    kh, kw = node["kernel_shape"]
    n, c, ho, wo, _ = spread.shape
    out = np.zeros_like(x)
    out[:, :, : ho * kh, : wo * kw] = (
        spread.reshape(n, c, ho, wo, kh, kw).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, ho * kh, wo * kw)
    )
    return out


def _max_pool_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    """The cotangent to each window's first maximum (torch's choice among ties)."""
    windows = _windows(node, xs[0])
    spread = np.zeros(windows.shape, g.dtype)
    np.put_along_axis(spread, windows.argmax(axis=-1)[..., None], g[..., None], axis=-1)
    return [_untiled(node, xs[0], spread)]


def _average_pool_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    kh, kw = node["kernel_shape"]
    spread = np.broadcast_to((g / (kh * kw))[..., None], (*g.shape, kh * kw))
    return [_untiled(node, xs[0], spread)]


GRADIENT_RULES.add(
    "MaxPool",
    GradientRule(lambda node, x: _windows(node, x).max(axis=-1), _max_pool_back, accepts=_tiles),
)
GRADIENT_RULES.add(
    "AveragePool",
    GradientRule(lambda node, x: _windows(node, x).mean(axis=-1), _average_pool_back, accepts=_tiles),
)

GRADIENT_RULES.add(
    "GlobalAveragePool",
    GradientRule(lambda node, x: _mean(x, tuple(range(2, x.ndim)), keepdims=True), _global_average_back),
)


def _gemm(node: OpNode, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    a = a.T if node["transA"] else a
    b = b.T if node["transB"] else b
    alpha, beta = node["alpha"], node["beta"]
    y = a @ b if alpha == 1.0 else alpha * (a @ b)
    if c is not None:
        y = y + (c if beta == 1.0 else beta * c)
    return y.astype(a.dtype, copy=False)


def _gemm_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    a, b = xs[0], xs[1]
    a2 = a.T if node["transA"] else a
    b2 = b.T if node["transB"] else b
    out: list[np.ndarray | None] = [None] * len(xs)
    if wanted[0]:
        ga = g @ b2.T if node["alpha"] == 1.0 else node["alpha"] * (g @ b2.T)
        out[0] = ga.T if node["transA"] else ga
    if wanted[1]:
        gb = node["alpha"] * (a2.T @ g)
        out[1] = gb.T if node["transB"] else gb
    if len(xs) > 2 and wanted[2]:
        out[2] = _unbroadcast(node["beta"] * g, xs[2].shape)
    return out


def _matmul_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    a, b = xs
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g.reshape(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]))
    ga = _unbroadcast(g2 @ np.swapaxes(b2, -1, -2), a2.shape)
    gb = _unbroadcast(np.swapaxes(a2, -1, -2) @ g2, b2.shape)
    return [ga.reshape(a.shape), gb.reshape(b.shape)]


GRADIENT_RULES.add("Gemm", GradientRule(_gemm, _gemm_back))
GRADIENT_RULES.add("MatMul", GradientRule(lambda node, a, b: a @ b, _matmul_back))


def _channels(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A per-channel vector shaped to broadcast along axis 1 of ``x``."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _inverse_std(node: OpNode, var: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(var + np.asarray(node["epsilon"], var.dtype))


def _batch_norm(
    node: OpNode, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
) -> np.ndarray:
    """``x * a + b`` per channel, ``a = scale / std`` and ``b = bias - mean * a`` (as ONNX Runtime computes it):
    two passes over ``x`` where ``(x - mean) * a + bias`` takes three."""
    a = _inverse_std(node, var) * scale
    y = x * _channels(x, a)
    y += _channels(x, bias - mean * a)
    return y


def _batch_norm_back(
    node: OpNode, xs: Arrays, ys: Arrays, g: np.ndarray, wanted: Wanted
) -> list[np.ndarray | None]:
    """The scale's cotangent ``sum(g * (x - mean)) / std`` as ``(sum(g * x) - mean * sum(g)) / std``: one pass
    over ``x`` where the normalised input takes three."""
    x, scale, _, mean, var = xs
    inv = _inverse_std(node, var)
    g_sum = _channel_sum(g)
    g_scale = inv * (_channel_sum(g * x) - mean * g_sum)
    gx = g * _channels(x, inv * scale) if wanted[0] else None
    return [gx, g_scale, g_sum, None, None]


GRADIENT_RULES.add(
    "BatchNormalization",
    # inference: the given statistics (batch statistics, training mode, run in torch)
    GradientRule(
        _batch_norm,
        _batch_norm_back,
        accepts=lambda node: not node.train_bn and not node.get("training_mode", 0),
    ),
)
