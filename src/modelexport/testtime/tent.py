"""Tent (Wang et al., ICLR 2021): minimise prediction entropy by updating only the BN affine parameters.

Gradients need PyTorch. With the source torch model, a deep copy is adapted (BN layers use batch
statistics, everything else stays in eval mode). Without it, the ONNX graph is run by
:class:`OnnxTorchModule`, a small ONNX -> torch interpreter limited to the operators of convolutional
classifiers (listed in ``SUPPORTED_OPS``). We wrote it because ``onnx2torch`` requires torchvision
(not installable here) and ``onnx2pytorch`` documents that batches > 1 with BatchNorm are only "experimental"
and that training converted models is untested, which is exactly what Tent does; an unsupported operator raises a
:class:`TestTimeError` naming it. Updated scale/bias go back into the BN state; the batch statistics
under those parameters are then measured by ONNX Runtime (:class:`BNAdapter`), so prediction runs there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import TestTimeError
from .adapt import BNAdapter, BNState
from .graph import constant_value

__all__ = ["OnnxTorchModule", "SUPPORTED_OPS", "tent_adapt"]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pads(attrs: dict[str, Any], n: int) -> tuple[list[int], bool]:
    pads = list(attrs.get("pads", [0] * 2 * n))
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise TestTimeError("Conv/Pool with auto_pad SAME is not supported by the ONNX -> torch interpreter")
    return pads, pads[:n] == pads[n:]


def _spatial(x: Any, pads: list[int], n: int, value: float = 0.0) -> Any:
    import torch.nn.functional as F

    torch_pads: list[int] = []
    for i in reversed(range(n)):
        torch_pads += [pads[i], pads[i + n]]
    return F.pad(x, torch_pads, value=value)


def _conv(node: onnx.NodeProto, x: Any, w: Any, b: Any = None) -> Any:
    import torch.nn.functional as F

    a = _attrs(node)
    n = w.dim() - 2
    pads, sym = _pads(a, n)
    if not sym:
        x = _spatial(x, pads, n)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]
    return fn(
        x,
        w,
        b,
        a.get("strides", [1] * n),
        pads[:n] if sym else 0,
        a.get("dilations", [1] * n),
        a.get("group", 1),
    )


def _pool(node: onnx.NodeProto, x: Any, kind: str) -> Any:
    import torch.nn.functional as F

    a = _attrs(node)
    k = list(a["kernel_shape"])
    n = len(k)
    pads, sym = _pads(a, n)
    if kind == "max":
        if not sym:
            x = _spatial(x, pads, n, float("-inf"))
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
        return fn(
            x,
            k,
            a.get("strides", k),
            pads[:n] if sym else 0,
            a.get("dilations", [1] * n),
            bool(a.get("ceil_mode", 0)),
        )
    if not sym:
        raise TestTimeError(
            "AveragePool with asymmetric pads is not supported by the ONNX -> torch interpreter"
        )
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    return fn(
        x, k, a.get("strides", k), pads[:n], bool(a.get("ceil_mode", 0)), bool(a.get("count_include_pad", 0))
    )


def _gemm(node: onnx.NodeProto, a: Any, b: Any, c: Any = None) -> Any:
    at = _attrs(node)
    a = a.t() if at.get("transA", 0) else a
    b = b.t() if at.get("transB", 0) else b
    y = at.get("alpha", 1.0) * (a @ b)
    return y if c is None else y + at.get("beta", 1.0) * c


def _reduce_mean(node: onnx.NodeProto, x: Any, axes: Any = None) -> Any:
    a = _attrs(node)
    dims = [int(v) for v in (axes.tolist() if axes is not None else a.get("axes", range(x.dim())))]
    return x.mean(dim=dims, keepdim=bool(a.get("keepdims", 1)))


def _reshape(node: onnx.NodeProto, x: Any, shape: Any) -> Any:
    dims = [int(v) for v in shape.tolist()]
    if not _attrs(node).get("allowzero", 0):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _flatten(node: onnx.NodeProto, x: Any) -> Any:
    axis = _attrs(node).get("axis", 1)
    return x.reshape(int(np.prod(x.shape[:axis])) if axis else 1, -1)


def _unsqueeze(node: onnx.NodeProto, x: Any, axes: Any = None) -> Any:
    raw = [int(v) for v in (axes.tolist() if axes is not None else _attrs(node)["axes"])]
    rank = x.dim() + len(raw)  # negative axes count from the end of the output
    for d in sorted(v % rank for v in raw):
        x = x.unsqueeze(d)
    return x


def _squeeze(node: onnx.NodeProto, x: Any, axes: Any = None) -> Any:
    dims = axes.tolist() if axes is not None else _attrs(node).get("axes")
    return x.squeeze() if dims is None else x.squeeze(tuple(int(d) for d in dims))


def _concat(node: onnx.NodeProto, *xs: Any) -> Any:
    import torch

    return torch.cat(xs, dim=_attrs(node)["axis"])


#: ONNX op -> fn(node, *torch inputs) -> torch output (single-output ops; BatchNormalization is the module's own).
SUPPORTED_OPS: dict[str, Callable[..., Any]] = {
    "Conv": _conv,
    "MaxPool": lambda n, x: _pool(n, x, "max"),
    "AveragePool": lambda n, x: _pool(n, x, "avg"),
    "GlobalAveragePool": lambda n, x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True),
    "Gemm": _gemm,
    "MatMul": lambda n, a, b: a @ b,
    "Add": lambda n, a, b: a + b,
    "Sub": lambda n, a, b: a - b,
    "Mul": lambda n, a, b: a * b,
    "Div": lambda n, a, b: a / b,
    "Relu": lambda n, x: x.relu(),
    "Sigmoid": lambda n, x: x.sigmoid(),
    "Tanh": lambda n, x: x.tanh(),
    "Softmax": lambda n, x: x.softmax(dim=_attrs(n).get("axis", -1)),
    "ReduceMean": _reduce_mean,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": lambda n, x: x.permute(*_attrs(n).get("perm", list(reversed(range(x.dim()))))),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Identity": lambda n, x: x,
    "Dropout": lambda n, x, *rest: x,  # Tent adapts the deterministic (eval) network
    "BatchNormalization": None,  # handled by OnnxTorchModule._bn
    "Constant": None,  # folded when the module is built
}


class OnnxTorchModule:
    """Run an ONNX graph with torch ops; BN scale/bias are trainable parameters named after their initializers."""

    def __init__(self, model: onnx.ModelProto, state: BNState | None = None, train_bn: bool = True) -> None:
        import torch

        unsupported = sorted({n.op_type for n in model.graph.node if n.op_type not in SUPPORTED_OPS})
        if unsupported:
            raise TestTimeError(
                f"Tent on an ONNX-only model: operators {unsupported} are not supported by the built-in ONNX -> torch "
                f"interpreter (supported: {', '.join(sorted(SUPPORTED_OPS))})",
                hint="pass the source torch model (TestTimeEngine(..., torch_model=model)) or use --ttt bn",
            )
        self.model = model
        self.train_bn = train_bn
        state = state or {}
        bn_params = {
            p for n in model.graph.node if n.op_type == "BatchNormalization" for p in list(n.input)[1:3]
        }
        self.values: dict[str, Any] = {}
        self.parameters: dict[str, torch.nn.Parameter] = {}
        for t in model.graph.initializer:
            arr = np.array(state.get(t.name, numpy_helper.to_array(t)))
            tensor = torch.from_numpy(arr.copy())
            if t.name in bn_params:
                tensor = torch.nn.Parameter(tensor.float())
                self.parameters[t.name] = tensor
            self.values[t.name] = tensor
        for node in model.graph.node:
            if node.op_type == "Constant":
                self.values[node.output[0]] = torch.from_numpy(
                    np.array(constant_value(model, node.output[0]))
                )

    def _bn(self, node: onnx.NodeProto, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
        import torch.nn.functional as F

        eps = _attrs(node).get("epsilon", 1e-5)
        if self.train_bn:
            return F.batch_norm(x, None, None, scale, bias, training=True, eps=eps)
        return F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps)

    def __call__(self, feeds: dict[str, Any]) -> list[Any]:
        import torch

        env = dict(self.values)
        env.update(
            {
                k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
                for k, v in feeds.items()
            }
        )
        for node in self.model.graph.node:
            if node.op_type == "Constant":
                continue
            args = [env[i] if i else None for i in node.input]
            while args and args[-1] is None:
                args.pop()
            fn = self._bn if node.op_type == "BatchNormalization" else SUPPORTED_OPS[node.op_type]
            env[node.output[0]] = fn(node, *args)
        return [env[o.name] for o in self.model.graph.output]


def _entropy_loss(logits: Any) -> Any:
    log_p = logits.log_softmax(dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1).mean()


def _tent_torch_model(
    torch_model: Any, x: Any, adapter: BNAdapter, state: BNState, lr: float, steps: int
) -> BNState:
    """Tent on a deep copy of the source torch model; BN modules are matched to ONNX BN nodes by name."""
    import torch

    model = copy.deepcopy(torch_model).eval()
    by_scale = {layer.scale: layer for layer in adapter.layers}
    bns = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    if {f"{n}.weight" for n in bns} != set(by_scale):
        raise TestTimeError(
            "cannot match the torch model's BatchNorm modules to the ONNX BatchNormalization nodes by name",
            hint="pass the torch model that was exported, or leave torch_model out to adapt the ONNX graph",
        )
    params = []
    with torch.no_grad():
        for name, m in bns.items():
            layer = by_scale[f"{name}.weight"]
            m.weight.copy_(torch.from_numpy(np.array(state[layer.scale])))
            m.bias.copy_(torch.from_numpy(np.array(state[layer.bias])))
            m.train()
            m.track_running_stats, m.running_mean, m.running_var = False, None, None
    for p in model.parameters():
        p.requires_grad_(False)
    for m in bns.values():
        m.weight.requires_grad_(True)
        m.bias.requires_grad_(True)
        params += [m.weight, m.bias]
    _optimize(lambda: model(x), params, lr, steps)
    out = dict(state)
    for name, m in bns.items():
        layer = by_scale[f"{name}.weight"]
        out[layer.scale] = m.weight.detach().numpy().astype(state[layer.scale].dtype)
        out[layer.bias] = m.bias.detach().numpy().astype(state[layer.bias].dtype)
    return out


def _optimize(forward: Callable[[], Any], params: list[Any], lr: float, steps: int) -> None:
    import torch

    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        _entropy_loss(forward()).backward()
        opt.step()


def tent_adapt(
    adapter: BNAdapter,
    feeds: dict[str, np.ndarray],
    prior: BNState | None = None,
    learning_rate: float = 1e-3,
    steps: int | None = 1,
    torch_model: Any = None,
) -> BNState:
    """A BN state after ``steps`` Tent updates on this batch: new scale/bias, then batch statistics under them."""
    import torch

    state = {**adapter.source_state, **(prior or {})}
    steps = 1 if steps is None else steps
    with torch.enable_grad():
        if torch_model is not None:
            if len(feeds) != 1:
                raise TestTimeError(
                    "Tent with a torch model supports single-input models; leave torch_model out"
                )
            x = torch.from_numpy(np.asarray(next(iter(feeds.values()))))
            state = _tent_torch_model(torch_model, x, adapter, state, learning_rate, steps)
        else:
            module = OnnxTorchModule(adapter.source, state, train_bn=True)
            tfeeds = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
            _optimize(lambda: module(tfeeds)[0], list(module.parameters.values()), learning_rate, steps)
            for name, p in module.parameters.items():
                state[name] = p.detach().numpy().astype(state[name].dtype)
    return adapter.adapt(feeds, prior=state, momentum=1.0, iterations=None)
