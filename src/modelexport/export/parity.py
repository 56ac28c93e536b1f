"""Numerical equivalence: ONNX Runtime vs PyTorch on the same inputs, max abs diff per output.

The ONNX side runs on ONNX Runtime's CPU provider, except for what it has no kernels for: bfloat16
graphs (its CPU provider implements almost no bfloat16 op) run on onnx's reference evaluator, which
computes every op in numpy and rounds its result to bfloat16. The report names which one ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._registry import Registry
from ..errors import ParityError
from ..runtime.session import create_session
from .inputs import tensor_to_numpy

if TYPE_CHECKING:
    import torch

__all__ = [
    "ParityReport",
    "flatten_outputs",
    "output_names_for",
    "check_parity",
    "PARITY_RUNNERS",
    "runner_for",
]

#: runner name -> fn(model bytes or path, feeds) -> (output names, outputs, what ran them)
Runner = Callable[[bytes | Path, dict[str, np.ndarray]], tuple[list[str], list[np.ndarray], str]]
PARITY_RUNNERS: Registry[Runner] = Registry("parity runner")


@PARITY_RUNNERS.register("onnxruntime")
def _onnxruntime(
    model: bytes | Path, feeds: dict[str, np.ndarray]
) -> tuple[list[str], list[np.ndarray], str]:
    session, info = create_session(model, graph_optimization_level="all")
    wanted = {i.name for i in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return [o.name for o in session.get_outputs()], outputs, info.provider


@PARITY_RUNNERS.register("onnx-reference")
def _onnx_reference(
    model: bytes | Path, feeds: dict[str, np.ndarray]
) -> tuple[list[str], list[np.ndarray], str]:
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    wanted = {i.name for i in proto.graph.input}
    outputs = ReferenceEvaluator(proto).run(None, {k: v for k, v in feeds.items() if k in wanted})
    return [o.name for o in proto.graph.output], list(outputs), "onnx.reference.ReferenceEvaluator"


def runner_for(dtype: str) -> str:
    """The runner for a graph in ``dtype``: ONNX Runtime, unless its CPU provider lacks the kernels."""
    return "onnx-reference" if dtype == "bfloat16" else "onnxruntime"


def flatten_outputs(out: object) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in the order torch.onnx flattens them; ModelOutput keys become names."""
    import torch
    import torch.utils._pytree as pytree

    flat: list[tuple[str, torch.Tensor]] = []

    def walk(obj: object, name: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat.append((name, obj))
        elif hasattr(obj, "keys") and hasattr(obj, "values"):
            for k in obj.keys():
                walk(obj[k], k if not name else f"{name}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{name}.{i}" if name else f"output_{i}")
        elif type(obj) in pytree.SUPPORTED_NODES:  # e.g. a cache object, flattened as torch.onnx does
            walk(list(pytree.SUPPORTED_NODES[type(obj)].flatten_fn(obj)[0]), name)

    walk(out, "")
    if len(flat) == 1 and flat[0][0] == "":
        flat = [("output", flat[0][1])]
    return [(n if n else f"output_{i}", t) for i, (n, t) in enumerate(flat)]


def output_names_for(reference: list[tuple[str, Any]]) -> tuple[str, ...] | None:
    names = tuple(n.replace(".", "_") for n, _ in reference)
    return names if len(set(names)) == len(names) else None


@dataclass
class ParityReport:
    """Max abs diff per output and the tolerance it was judged against.

    With ``scaled`` (fp16/bf16 graphs) an output's bound is ``atol * max(1, max |reference|)``: a
    reduced-precision value is only as exact as its magnitude allows, and hidden states reach
    magnitudes where one bf16 step is already ~0.03. fp32 keeps the plain absolute bound.
    """

    atol: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    provider: str = "CPUExecutionProvider"
    scaled: bool = False
    bound: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(d <= self.bound.get(k, self.atol) for k, d in self.max_abs_diff.items())

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values(), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "atol": self.atol,
            "max_abs_diff": self.max_abs_diff,
            "passed": self.passed,
            "provider": self.provider,
        }
        return {**out, "bound": self.bound} if self.scaled else out


def check_parity(
    model: bytes | Path,
    feeds: dict[str, np.ndarray],
    reference: list[tuple[str, Any]],
    atol: float,
    runner: str = "onnxruntime",
    scaled: bool = False,
) -> ParityReport:
    """Run the ONNX model (``runner``: a :data:`PARITY_RUNNERS` name) and compare with the PyTorch
    ``reference`` outputs; raise ParityError beyond atol (``scaled``: see :class:`ParityReport`)."""
    onnx_names, outputs, provider = PARITY_RUNNERS[runner](model, feeds)
    report = ParityReport(atol=atol, provider=provider, scaled=scaled)
    if len(outputs) != len(reference):
        raise ParityError(f"ONNX model has {len(outputs)} outputs but PyTorch returned {len(reference)}")
    for name, got, (_, want) in zip(onnx_names, outputs, reference, strict=True):
        want_np = tensor_to_numpy(want)
        if got.shape != want_np.shape:
            raise ParityError(f"output {name!r}: ONNX shape {got.shape} != PyTorch shape {want_np.shape}")
        diff = np.abs(got.astype(np.float64) - want_np.astype(np.float64))
        report.max_abs_diff[name] = float(diff.max()) if diff.size else 0.0
        if scaled:
            peak = float(np.abs(want_np.astype(np.float64)).max()) if want_np.size else 0.0
            report.bound[name] = atol * max(1.0, peak)
    if not report.passed:
        bad = {k: f"{v:.3g}" for k, v in report.max_abs_diff.items() if v > report.bound.get(k, atol)}
        raise ParityError(
            f"{provider} differs from PyTorch beyond atol={atol}{' (scaled)' if scaled else ''}: "
            f"max abs diff {bad}"
        )
    return report
