"""Numerical equivalence: ONNX Runtime vs PyTorch on the same inputs, max abs diff per output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ParityError
from ..runtime.session import create_session

__all__ = ["ParityReport", "flatten_outputs", "output_names_for", "check_parity"]


def flatten_outputs(out: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs in the order torch.onnx flattens them; ModelOutput keys become names."""
    import torch
    import torch.utils._pytree as pytree

    flat: list[tuple[str, Any]] = []

    def walk(obj: Any, name: str) -> None:
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
    """Max abs diff per output and the tolerance it was judged against."""

    atol: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    provider: str = "CPUExecutionProvider"

    @property
    def passed(self) -> bool:
        return all(d <= self.atol for d in self.max_abs_diff.values())

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values(), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "atol": self.atol,
            "max_abs_diff": self.max_abs_diff,
            "passed": self.passed,
            "provider": self.provider,
        }


def check_parity(
    model: bytes | Any, feeds: dict[str, np.ndarray], reference: list[tuple[str, Any]], atol: float
) -> ParityReport:
    """Run ONNX Runtime and compare with the PyTorch ``reference`` outputs; raise ParityError beyond atol."""
    session, info = create_session(model, graph_optimization_level="all")
    wanted = {i.name for i in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    report = ParityReport(atol=atol, provider=info.provider)
    onnx_names = [o.name for o in session.get_outputs()]
    if len(outputs) != len(reference):
        raise ParityError(f"ONNX model has {len(outputs)} outputs but PyTorch returned {len(reference)}")
    for name, got, (_, want) in zip(onnx_names, outputs, reference, strict=True):
        want_np = want.detach().cpu().numpy()
        if got.shape != want_np.shape:
            raise ParityError(f"output {name!r}: ONNX shape {got.shape} != PyTorch shape {want_np.shape}")
        diff = np.abs(got.astype(np.float64) - want_np.astype(np.float64))
        report.max_abs_diff[name] = float(diff.max()) if diff.size else 0.0
    if not report.passed:
        bad = {k: f"{v:.3g}" for k, v in report.max_abs_diff.items() if v > atol}
        raise ParityError(f"ONNX Runtime differs from PyTorch beyond atol={atol}: max abs diff {bad}")
    return report
