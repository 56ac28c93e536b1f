"""A small ONNX -> torch interpreter: runs an ONNX graph with differentiable torch ops, so Tent can take gradients.

Each operator is one handler in :data:`SUPPORTED_OPS` (``op_type -> fn(node, *inputs)``). A handler receives the
node's attributes already merged with the defaults of the operator's schema at the model's opset
(``onnx.defs.get_schema``), and ``node.since`` (the schema version in force) where an opset changed the
semantics (axes as an input instead of an attribute, Softmax's 2-D coercion before opset 13). Defaults the schema
states only in prose (strides 1, pads 0, dilations 1, ``perm`` reversed) are written in the handlers. Every
operator is checked against ONNX Runtime in ``tests/testtime/test_interpreter_ops.py``.

We wrote it because ``onnx2torch`` requires torchvision (not installable here) and ``onnx2pytorch`` documents that
batches > 1 with BatchNorm are only "experimental" and that training converted models is untested, which is exactly
what Tent does. An operator outside the registry raises :class:`TestTimeError` naming it before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._registry import Registry
from ..errors import TestTimeError

__all__ = [
    "SUPPORTED_OPS",
    "OnnxTorchModule",
    "OpNode",
    "axis_index",
    "default_opset",
    "node_axes",
    "op_node",
]

#: Tensor in and out of handlers: a ``torch.Tensor`` (torch is imported lazily, it is heavy).
Tensor = Any

UNSUPPORTED_HINT = "pass the source torch model (TestTimeEngine(..., torch_model=model)) or use --ttt bn"


@dataclass(frozen=True)
class OpNode:
    """What a handler needs from its node: attributes (schema defaults filled in), schema version, outputs."""

    op: str
    attrs: dict[str, Any]
    since: int
    outputs: tuple[str, ...]
    train_bn: bool = False

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    def get(self, name: str, default: object = None) -> Any:
        return self.attrs.get(name, default)


#: ONNX op_type -> handler(node, *inputs) returning a tensor or a tuple of tensors (one per node output).
SUPPORTED_OPS: Registry[Callable[..., Any]] = Registry(
    "ONNX operator", error=TestTimeError, hint="choose the ONNX operator from the list"
)


def _ints(t: Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def axis_index(axis: int, rank: int) -> int:
    """A (possibly negative) ONNX axis as an index into ``rank`` dimensions."""
    return axis + rank if axis < 0 else axis


def _torch_dtype(onnx_type: int) -> Any:
    import torch

    if onnx_type == TensorProto.BFLOAT16:
        return torch.bfloat16
    if onnx_type in (TensorProto.STRING, TensorProto.UNDEFINED) or onnx_type >= TensorProto.FLOAT8E4M3FN:
        raise TestTimeError(f"the ONNX -> torch interpreter has no torch type for ONNX type {onnx_type}")
    return torch.from_numpy(np.zeros(0, helper.tensor_dtype_to_np_dtype(onnx_type))).dtype


# --- tensors and shapes --------------------------------------------------------------------------------------------


def _from_numpy(value: np.ndarray) -> Tensor:
    import torch

    return torch.from_numpy(np.array(value))


@SUPPORTED_OPS.register("Constant")
def _constant(node: OpNode) -> Tensor:
    (name, value), *_ = ((k, v) for k, v in node.attrs.items() if k.startswith(("value", "sparse")))
    if name == "value":
        return _from_numpy(numpy_helper.to_array(value))
    kinds = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
    }
    if name not in kinds:
        raise TestTimeError(
            f"Constant with attribute {name!r} is not supported by the ONNX -> torch interpreter"
        )
    return _from_numpy(np.asarray(value, dtype=kinds[name]))


@SUPPORTED_OPS.register("ConstantOfShape")
def _constant_of_shape(node: OpNode, shape: Tensor) -> Tensor:
    value = node.get("value")
    arr = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    fill = _from_numpy(arr).reshape(())
    return fill.expand(_ints(shape)).clone()


@SUPPORTED_OPS.register("Shape")
def _shape(node: OpNode, x: Tensor) -> Tensor:
    dims = list(x.shape)[node.get("start", 0) : node.get("end")]  # python slicing clamps like ONNX
    return _from_numpy(np.array(dims, dtype=np.int64))


@SUPPORTED_OPS.register("Size")
def _size(node: OpNode, x: Tensor) -> Tensor:
    return _from_numpy(np.array(x.numel(), dtype=np.int64))


@SUPPORTED_OPS.register("Gather")
def _gather(node: OpNode, x: Tensor, indices: Tensor) -> Tensor:
    axis = axis_index(node["axis"], x.dim())
    idx = indices.long()
    idx = idx.where(idx >= 0, idx + x.shape[axis])
    out = x.index_select(axis, idx.reshape(-1))
    return out.reshape((*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]))  # a scalar index: ()


@SUPPORTED_OPS.register("Concat")
def _concat(node: OpNode, *xs: Tensor) -> Tensor:
    import torch

    return torch.cat(xs, dim=node["axis"])


def node_axes(node: OpNode, axes: Tensor | None, input_since: int) -> list[int] | None:
    """Axes from the input (opset >= ``input_since``; a torch tensor or a numpy array) or the attribute
    (before); None when absent."""
    if node.since >= input_since:
        return None if axes is None else _ints(axes)
    return node.get("axes")


@SUPPORTED_OPS.register("Unsqueeze")
def _unsqueeze(node: OpNode, x: Tensor, axes: Tensor | None = None) -> Tensor:
    raw = node_axes(node, axes, 13) or []
    rank = x.dim() + len(raw)  # negative axes count from the end of the output
    for d in sorted(axis_index(v, rank) for v in raw):
        x = x.unsqueeze(d)
    return x


@SUPPORTED_OPS.register("Squeeze")
def _squeeze(node: OpNode, x: Tensor, axes: Tensor | None = None) -> Tensor:
    dims = node_axes(node, axes, 13)
    if dims is None:
        return x.reshape([d for d in x.shape if d != 1])
    drop = {axis_index(d, x.dim()) for d in dims}
    return x.reshape([d for i, d in enumerate(x.shape) if i not in drop])


@SUPPORTED_OPS.register("Reshape")
def _reshape(node: OpNode, x: Tensor, shape: Tensor) -> Tensor:
    dims = _ints(shape)
    if not node.get("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@SUPPORTED_OPS.register("Flatten")
def _flatten(node: OpNode, x: Tensor) -> Tensor:
    axis = axis_index(node["axis"], x.dim())
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@SUPPORTED_OPS.register("Transpose")
def _transpose(node: OpNode, x: Tensor) -> Tensor:
    return x.permute(*(node.get("perm") or reversed(range(x.dim()))))


@SUPPORTED_OPS.register("Expand")
def _expand(node: OpNode, x: Tensor, shape: Tensor) -> Tensor:
    import torch

    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(shape))))


def _slice_axis(x: Tensor, axis: int, start: int, end: int, step: int) -> Tensor:
    dim = x.shape[axis]
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return x[(slice(None),) * axis + (slice(max(0, min(start, dim)), max(0, min(end, dim)), step),)]
    start, end = max(-1, min(start, dim - 1)), max(-1, min(end, dim - 1))
    idx = _from_numpy(np.arange(start, end, step, dtype=np.int64))
    return x.index_select(axis, idx)


@SUPPORTED_OPS.register("Slice")
def _slice(
    node: OpNode,
    x: Tensor,
    starts: Tensor | None = None,
    ends: Tensor | None = None,
    axes: Tensor | None = None,
    steps: Tensor | None = None,
) -> Tensor:
    if node.since >= 10:
        s, e = _ints(starts), _ints(ends)
        ax = _ints(axes) if axes is not None else list(range(len(s)))
        st = _ints(steps) if steps is not None else [1] * len(s)
    else:
        s, e = node["starts"], node["ends"]
        ax, st = node.get("axes") or list(range(len(s))), [1] * len(s)
    for a, start, end, step in zip(ax, s, e, st, strict=True):
        x = _slice_axis(x, axis_index(a, x.dim()), start, end, step)
    return x


@SUPPORTED_OPS.register("Cast")
def _cast(node: OpNode, x: Tensor) -> Tensor:
    return x.to(_torch_dtype(node["to"]))


@SUPPORTED_OPS.register("CastLike")
def _cast_like(node: OpNode, x: Tensor, like: Tensor) -> Tensor:
    return x.to(like.dtype)


@SUPPORTED_OPS.register("Identity")
def _identity(node: OpNode, x: Tensor) -> Tensor:
    return x


@SUPPORTED_OPS.register("Dropout")
def _dropout(node: OpNode, x: Tensor, *_: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """Identity: Tent adapts the deterministic (inference) network; the mask output is all ones."""
    if len(node.outputs) > 1:
        return x, x.new_ones(x.shape, dtype=_torch_dtype(TensorProto.BOOL))
    return x


# --- element-wise --------------------------------------------------------------------------------------------------


def _div(a: Tensor, b: Tensor) -> Tensor:
    """Integer Div truncates toward zero (C semantics, as ONNX Runtime computes it)."""
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        return a / b
    return a.div(b, rounding_mode="trunc")


_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _div,
    "Pow": lambda a, b: a.pow(b).to(a.dtype),
    "Equal": lambda a, b: a == b,
    "Less": lambda a, b: a < b,
    "Greater": lambda a, b: a > b,
}

_UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "Relu": lambda x: x.relu(),
    "Sigmoid": lambda x: x.sigmoid(),
    "Tanh": lambda x: x.tanh(),
    "Exp": lambda x: x.exp(),
    "Log": lambda x: x.log(),
    "Abs": lambda x: x.abs(),
    "Neg": lambda x: x.neg(),
    "Sqrt": lambda x: x.sqrt(),
    "Reciprocal": lambda x: x.reciprocal(),
    "Erf": lambda x: x.erf(),
    "Floor": lambda x: x.floor(),
    "Ceil": lambda x: x.ceil(),
    "Softplus": lambda x: x.exp().log1p(),
    "Not": lambda x: x.logical_not(),
}


def _unary(fn: Callable[[Tensor], Tensor]) -> Callable[..., Tensor]:
    return lambda node, x: fn(x)


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Tensor]:
    return lambda node, a, b: fn(a, b)


for _name, _fn in _UNARY.items():
    SUPPORTED_OPS.add(_name, _unary(_fn))
for _name, _fn in _BINARY.items():
    SUPPORTED_OPS.add(_name, _binary(_fn))


def _variadic(node: OpNode, *xs: Tensor) -> Tensor:
    import torch

    combine = {"Max": torch.maximum, "Min": torch.minimum}.get(node.op, torch.add)
    out = xs[0]
    for x in xs[1:]:
        out = combine(out, x)
    return out / len(xs) if node.op == "Mean" else out


for _name in ("Max", "Min", "Sum", "Mean"):
    SUPPORTED_OPS.add(_name, _variadic)


@SUPPORTED_OPS.register("Where")
def _where(node: OpNode, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
    import torch

    return torch.where(cond, a, b)


@SUPPORTED_OPS.register("LeakyRelu")
def _leaky_relu(node: OpNode, x: Tensor) -> Tensor:
    return x.where(x >= 0, x * node["alpha"])


@SUPPORTED_OPS.register("PRelu")
def _prelu(node: OpNode, x: Tensor, slope: Tensor) -> Tensor:
    return x.where(x >= 0, x * slope)


@SUPPORTED_OPS.register("Elu")
def _elu(node: OpNode, x: Tensor) -> Tensor:
    return x.where(x >= 0, node["alpha"] * x.expm1())


@SUPPORTED_OPS.register("HardSigmoid")
def _hard_sigmoid(node: OpNode, x: Tensor) -> Tensor:
    return (node["alpha"] * x + node["beta"]).clamp(0.0, 1.0)


@SUPPORTED_OPS.register("HardSwish")
def _hard_swish(node: OpNode, x: Tensor) -> Tensor:
    return x * (x / 6.0 + 0.5).clamp(0.0, 1.0)


@SUPPORTED_OPS.register("Gelu")
def _gelu(node: OpNode, x: Tensor) -> Tensor:
    import torch.nn.functional as F

    return F.gelu(x, approximate=node["approximate"])


@SUPPORTED_OPS.register("Clip")
def _clip(node: OpNode, x: Tensor, low: Tensor | None = None, high: Tensor | None = None) -> Tensor:
    if node.since < 11:
        return x.clamp(node["min"], node["max"])
    if low is not None:
        x = x.where(x >= low, low.to(x.dtype))
    if high is not None:
        x = x.where(x <= high, high.to(x.dtype))
    return x


def _softmax_like(node: OpNode, x: Tensor, log: bool) -> Tensor:
    """Since opset 13 along ``axis`` (default -1); before, on the input coerced to 2-D at ``axis`` (default 1)."""
    fn = (lambda t, d: t.log_softmax(d)) if log else (lambda t, d: t.softmax(d))
    if node.since >= 13:
        return fn(x, node["axis"])
    axis = axis_index(node["axis"], x.dim())
    flat = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return fn(flat, 1).reshape(x.shape)


SUPPORTED_OPS.add("Softmax", lambda node, x: _softmax_like(node, x, log=False))
SUPPORTED_OPS.add("LogSoftmax", lambda node, x: _softmax_like(node, x, log=True))


#: Reduce op -> (torch reduction over dims, opset from which ``axes`` is an input rather than an attribute).
_REDUCTIONS: dict[str, tuple[Callable[[Tensor, list[int], bool], Tensor], int]] = {
    "ReduceMean": (lambda x, d, k: x.mean(dim=d, keepdim=k), 18),
    "ReduceSum": (lambda x, d, k: x.sum(dim=d, keepdim=k), 13),
    "ReduceMax": (lambda x, d, k: x.amax(dim=d, keepdim=k), 18),
    "ReduceMin": (lambda x, d, k: x.amin(dim=d, keepdim=k), 18),
}


def _reduce(node: OpNode, x: Tensor, axes: Tensor | None = None) -> Tensor:
    fn, input_since = _REDUCTIONS[node.op]
    dims = node_axes(node, axes, input_since) or []
    if not dims:
        if node.get("noop_with_empty_axes", 0):
            return x
        dims = list(range(x.dim()))
    return fn(x, [axis_index(d, x.dim()) for d in dims], bool(node["keepdims"]))


for _name in _REDUCTIONS:
    SUPPORTED_OPS.add(_name, _reduce)


# --- linear algebra ------------------------------------------------------------------------------------------------


@SUPPORTED_OPS.register("MatMul")
def _matmul(node: OpNode, a: Tensor, b: Tensor) -> Tensor:
    return a @ b


@SUPPORTED_OPS.register("Gemm")
def _gemm(node: OpNode, a: Tensor, b: Tensor, c: Tensor | None = None) -> Tensor:
    a = a.t() if node["transA"] else a
    b = b.t() if node["transB"] else b
    y = node["alpha"] * (a @ b)
    return y if c is None else y + node["beta"] * c


# --- convolution, pooling, normalisation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """A sliding window over the spatial dims: kernel, strides, dilations and explicit (begin, end) pads."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[tuple[int, int]]

    @classmethod
    def of(cls, node: OpNode, spatial: list[int], kernel: list[int]) -> _Window:
        n = len(kernel)
        strides, dilations = node.get("strides") or [1] * n, node.get("dilations") or [1] * n
        mode = node.get("auto_pad", "NOTSET")
        if mode == "NOTSET":
            flat = node.get("pads") or [0] * 2 * n
            return cls(kernel, strides, dilations, [(flat[i], flat[i + n]) for i in range(n)])
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            total = 0 if mode == "VALID" else max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if mode == "SAME_UPPER" else (big, small))
        return cls(kernel, strides, dilations, pads)

    def ceil_extra(self, spatial: list[int]) -> list[int]:
        """End padding ``ceil_mode`` adds; a last window starting past the input and begin pad is dropped."""
        extra = []
        for size, k, s, d, (pb, pe) in zip(
            spatial, self.kernel, self.strides, self.dilations, self.pads, strict=True
        ):
            eff = (k - 1) * d + 1
            out = -(-(size + pb + pe - eff) // s) + 1
            if (out - 1) * s >= size + pb:
                out -= 1
            extra.append(max(0, (out - 1) * s + eff - (size + pb + pe)))
        return extra


def _pad(x: Tensor, pads: list[tuple[int, int]], value: float = 0.0) -> Tensor:
    """Pad the trailing ``len(pads)`` dims by (begin, end) each."""
    import torch.nn.functional as F

    flat = [p for begin_end in reversed(pads) for p in begin_end]
    return F.pad(x, flat, value=value) if any(flat) else x


def _functional(kind: str, n: int) -> Callable[..., Tensor]:
    import torch.nn.functional as F

    if n not in (1, 2, 3):
        raise TestTimeError(f"{kind} over {n} spatial dims is not supported by the ONNX -> torch interpreter")
    return getattr(F, f"{kind}{n}d")


@SUPPORTED_OPS.register("Conv")
def _conv(node: OpNode, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    spatial = list(x.shape[2:])
    win = _Window.of(node, spatial, node.get("kernel_shape") or list(w.shape[2:]))
    conv = _functional("conv", len(spatial))
    symmetric = all(pb == pe for pb, pe in win.pads)
    if not symmetric:
        x = _pad(x, win.pads)
    padding = [pb for pb, _ in win.pads] if symmetric else 0
    return conv(x, w, b, win.strides, padding, win.dilations, node["group"])


def _pool_input(node: OpNode, x: Tensor) -> tuple[_Window, list[tuple[int, int]]]:
    spatial = list(x.shape[2:])
    win = _Window.of(node, spatial, list(node["kernel_shape"]))
    extra = win.ceil_extra(spatial) if node.get("ceil_mode", 0) else [0] * len(spatial)
    return win, [(pb, pe + e) for (pb, pe), e in zip(win.pads, extra, strict=True)]


@SUPPORTED_OPS.register("MaxPool")
def _max_pool(node: OpNode, x: Tensor) -> Tensor:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise TestTimeError("MaxPool's Indices output is not supported by the ONNX -> torch interpreter")
    win, pads = _pool_input(node, x)
    pool = _functional("max_pool", len(win.kernel))
    return pool(_pad(x, pads, float("-inf")), win.kernel, win.strides, 0, win.dilations)


@SUPPORTED_OPS.register("AveragePool")
def _average_pool(node: OpNode, x: Tensor) -> Tensor:
    """Window sums over window counts; the count covers the pads only with ``count_include_pad``."""
    win, pads = _pool_input(node, x)
    conv = _functional("conv", len(win.kernel))
    channels, spatial = x.shape[1], list(x.shape[2:])
    ones = x.new_ones((channels, 1, *win.kernel))
    sums = conv(_pad(x, pads), ones, None, win.strides, 0, win.dilations, channels)
    mask = x.new_ones((1, 1, *spatial))
    if node.get("count_include_pad", 0):
        mask = _pad(mask, win.pads, 1.0)
        pads = [(0, pe - we) for (_, pe), (_, we) in zip(pads, win.pads, strict=True)]
    counts = conv(_pad(mask, pads), ones[:1], None, win.strides, 0, win.dilations)
    return sums / counts


def _global_pool(node: OpNode, x: Tensor) -> Tensor:
    dims = list(range(2, x.dim()))
    return (
        x.mean(dim=dims, keepdim=True) if node.op == "GlobalAveragePool" else x.amax(dim=dims, keepdim=True)
    )


for _name in ("GlobalAveragePool", "GlobalMaxPool"):
    SUPPORTED_OPS.add(_name, _global_pool)


@SUPPORTED_OPS.register("BatchNormalization")
def _batch_norm(node: OpNode, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """Inference BN, or batch statistics when the module adapts BN (Tent) or the node is in training mode."""
    import torch.nn.functional as F

    if node.train_bn or node.get("training_mode", 0):
        return F.batch_norm(x, None, None, scale, bias, training=True, eps=node["epsilon"])
    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=node["epsilon"])


@SUPPORTED_OPS.register("Pad")
def _pad_op(
    node: OpNode,
    x: Tensor,
    pads: Tensor | None = None,
    value: Tensor | None = None,
    axes: Tensor | None = None,
) -> Tensor:
    import torch.nn.functional as F

    if node.since >= 11:
        flat, fill = _ints(pads), 0.0 if value is None else value.item()
    else:
        flat, fill = list(node["pads"]), node["value"]
    ax = [axis_index(a, x.dim()) for a in _ints(axes)] if axes is not None else list(range(x.dim()))
    per_dim = dict.fromkeys(range(x.dim()), (0, 0)) | {
        a: (flat[i], flat[i + len(ax)]) for i, a in enumerate(ax)
    }
    first = next((d for d in range(x.dim()) if per_dim[d] != (0, 0)), x.dim())
    torch_pads = [p for d in reversed(range(first, x.dim())) for p in per_dim[d]]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[
        node["mode"]
    ]
    if mode == "constant":
        return F.pad(x, torch_pads, value=fill)
    return F.pad(x, torch_pads, mode=mode)


# --- the module ----------------------------------------------------------------------------------------------------


def _plain(value: object) -> object:
    """Attribute values as handlers want them: strings instead of bytes."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset (the version every schema is looked up at)."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise TestTimeError("the model imports no default ONNX opset ('' / 'ai.onnx'); cannot interpret it")


def _schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def op_node(node: onnx.NodeProto, schema: onnx.defs.OpSchema, train_bn: bool = False) -> OpNode:
    """What a handler reads of ``node``: its attributes over the schema's defaults, the schema's version."""
    attrs = {
        name: _plain(helper.get_attribute_value(a.default_value))
        for name, a in schema.attributes.items()
        if a.default_value.type != onnx.AttributeProto.UNDEFINED
    }
    attrs.update({a.name: _plain(helper.get_attribute_value(a)) for a in node.attribute})
    return OpNode(node.op_type, attrs, schema.since_version, tuple(node.output), train_bn)


@dataclass(frozen=True)
class _Step:
    fn: Callable[..., Any]
    node: OpNode
    inputs: tuple[str, ...]


class OnnxTorchModule:
    """Run an ONNX graph with torch ops; BN scale/bias are trainable parameters named after their initializers.

    ``train_bn``: BatchNormalization uses batch statistics (what Tent optimises through). ``state`` overrides
    initializer values by name. Unsupported operators raise :class:`TestTimeError` here, before anything runs.
    """

    def __init__(
        self, model: onnx.ModelProto, state: dict[str, np.ndarray] | None = None, train_bn: bool = True
    ):
        import torch

        opset = default_opset(model)
        schemas = [_schema(n, opset) for n in model.graph.node]
        unsupported = sorted(
            {
                n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                for n, s in zip(model.graph.node, schemas, strict=True)
                if s is None
            }
        )
        if unsupported:
            raise TestTimeError(
                f"Tent on an ONNX-only model: operators {unsupported} (opset {opset}) are not supported by the "
                f"built-in ONNX -> torch interpreter (supported: {', '.join(sorted(SUPPORTED_OPS))})",
                hint=UNSUPPORTED_HINT,
            )
        self.model = model
        self.train_bn = train_bn
        steps = [
            _Step(SUPPORTED_OPS.get(n.op_type), op_node(n, s, train_bn), tuple(n.input))
            for n, s in zip(model.graph.node, schemas, strict=True)
            if s is not None
        ]
        state = state or {}
        bn_params = {
            p for n in model.graph.node if n.op_type == "BatchNormalization" for p in list(n.input)[1:3]
        }
        self.values: dict[str, Tensor] = {}
        self.parameters: dict[str, torch.nn.Parameter] = {}
        for t in model.graph.initializer:
            tensor = torch.from_numpy(np.array(state.get(t.name, numpy_helper.to_array(t))))
            if t.name in bn_params:
                tensor = torch.nn.Parameter(tensor.float())
                self.parameters[t.name] = tensor
            self.values[t.name] = tensor
        # Constant nodes are values like the initializers, made once: a tail step runs the graph per step
        for step in (s for s in steps if s.node.op == "Constant"):
            self.values[step.node.outputs[0]] = step.fn(step.node)
        self.steps = [s for s in steps if s.node.op != "Constant"]

    def __call__(self, feeds: dict[str, Any]) -> list[Tensor]:
        import torch

        env = dict(self.values)
        env.update(
            {
                k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
                for k, v in feeds.items()
            }
        )
        for step in self.steps:
            args = [self._value(env, name) if name else None for name in step.inputs]
            while args and args[-1] is None:
                args.pop()
            result = step.fn(step.node, *args)
            results = result if isinstance(result, tuple) else (result,)
            wanted = [i for i, name in enumerate(step.node.outputs) if name]
            if wanted and wanted[-1] >= len(results):
                raise TestTimeError(
                    f"{step.node.op}: output {wanted[-1]} is not computed by the ONNX -> torch interpreter",
                    hint=UNSUPPORTED_HINT,
                )
            env.update({step.node.outputs[i]: results[i] for i in wanted})
        return [self._value(env, o.name) for o in self.model.graph.output]

    @staticmethod
    def _value(env: dict[str, Tensor], name: str) -> Tensor:
        if name not in env:
            raise TestTimeError(
                f"tensor {name!r} is neither fed, an initializer, nor computed before it is used"
            )
        return env[name]
