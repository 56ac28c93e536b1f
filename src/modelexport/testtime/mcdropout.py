"""Monte-Carlo dropout on ONNX Runtime.

Exports keep Dropout nodes with ``training_mode=True`` (``ExportConfig.keep_dropout``; both the dynamo and
the torchscript exporter do), but ONNX Runtime's graph optimizer removes every Dropout node at the basic
level, so the exported graph alone does *not* sample. :func:`enable_mc_dropout` therefore rewrites each
Dropout into an explicit seeded mask (``RandomUniformLike >= ratio``, scaled by ``1 / (1 - ratio)``),
which survives optimization. Each node gets its own seed derived from the given one, so a session built
from the same seed produces the same sequence of samples. N passes run as one batch (the input tiled N times).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._numeric import softmax
from ..errors import TestTimeError
from .aggregate import entropy
from .graph import ModelLike, constant_value, load_model

__all__ = ["enable_mc_dropout", "MCDropoutResult", "mc_summary"]

NO_DROPOUT_HINT = (
    "export with dropout kept active: ExportConfig.keep_dropout=True (`modelexport export --keep-dropout`)"
)


def enable_mc_dropout(model: ModelLike, seed: int = 0) -> onnx.ModelProto:
    """A copy where every Dropout samples a seeded mask at inference (ratio from the node, default 0.5)."""
    src = load_model(model)
    drops = [n for n in src.graph.node if n.op_type == "Dropout"]
    if not drops:
        raise TestTimeError("the model has no Dropout nodes: MC dropout does not apply", hint=NO_DROPOUT_HINT)
    nodes: list[onnx.NodeProto] = []
    for k, node in enumerate(src.graph.node):
        if node.op_type != "Dropout":
            nodes.append(node)
            continue
        ratio = _ratio(src, node)
        x, y, p = node.input[0], node.output[0], f"mc_dropout_{k}"
        nodes += [
            helper.make_node(
                "RandomUniformLike", [x], [f"{p}_u"], dtype=TensorProto.FLOAT, seed=float(seed * 1000 + k)
            ),
            helper.make_node(
                "Constant",
                [],
                [f"{p}_ratio"],
                value=helper.make_tensor(f"{p}_r", TensorProto.FLOAT, [], [ratio]),
            ),
            helper.make_node("GreaterOrEqual", [f"{p}_u", f"{p}_ratio"], [f"{p}_keep"]),
            helper.make_node("CastLike", [f"{p}_keep", x], [f"{p}_mask"]),
            helper.make_node("Mul", [x, f"{p}_mask"], [f"{p}_dropped"]),
            helper.make_node(
                "Constant",
                [],
                [f"{p}_scale"],
                value=helper.make_tensor(f"{p}_s", TensorProto.FLOAT, [], [1.0 / (1.0 - ratio)]),
            ),
            helper.make_node("CastLike", [f"{p}_scale", x], [f"{p}_scale_t"]),
            helper.make_node("Mul", [f"{p}_dropped", f"{p}_scale_t"], [y]),
        ]
        if len(node.output) > 1 and node.output[1]:
            nodes.append(helper.make_node("Identity", [f"{p}_keep"], [node.output[1]]))
    del src.graph.node[:]
    src.graph.node.extend(nodes)
    _ensure_opset(src, 15)
    return src


def _ratio(model: onnx.ModelProto, node: onnx.NodeProto) -> float:
    if len(node.input) > 1 and node.input[1]:
        value = constant_value(model, node.input[1])
        if value is None:
            raise TestTimeError(
                f"Dropout {node.name}: its ratio is computed at run time; MC dropout needs a constant ratio"
            )
        ratio = float(np.asarray(value).reshape(-1)[0])
    else:
        ratio = float(next((helper.get_attribute_value(a) for a in node.attribute if a.name == "ratio"), 0.5))
    if not 0.0 <= ratio < 1.0:
        raise TestTimeError(f"Dropout {node.name}: ratio {ratio} is outside [0, 1)")
    return ratio


def _ensure_opset(model: onnx.ModelProto, minimum: int) -> None:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version < minimum:
            raise TestTimeError(
                f"MC dropout needs opset >= {minimum} (CastLike); the model has opset {op.version}"
            )


@dataclass(frozen=True)
class MCDropoutResult:
    """Mean prediction and predictive uncertainty over N stochastic passes."""

    probs: np.ndarray  # (N, C) mean probabilities
    variance: np.ndarray  # (N, C) variance of the probabilities across passes
    entropy: np.ndarray  # (N,) predictive entropy of the mean
    mutual_information: np.ndarray  # (N,) entropy of the mean minus mean entropy (epistemic part)


def mc_summary(logits: np.ndarray) -> MCDropoutResult:
    """Summarize stacked pass logits of shape (passes, N, C)."""
    probs = softmax(np.asarray(logits, dtype=np.float64), -1)
    mean = probs.mean(axis=0)
    total = entropy(mean)
    return MCDropoutResult(
        mean.astype(np.float32),
        probs.var(axis=0).astype(np.float32),
        total.astype(np.float32),
        (total - entropy(probs).mean(axis=0)).astype(np.float32),
    )
