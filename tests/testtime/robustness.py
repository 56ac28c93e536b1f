"""The stream-robustness matrix of the test-time proof (slow test and benchmarks/test_time.py share it).

Corrupted digits (noise, contrast, blur at severities 3 and 5) streamed in three orders (shuffled,
class-sorted, Dirichlet 0.1), batch 64 and batch 1, episodic and continual; accuracy per method.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from modelexport.testtime import TestTimeEngine, TestTimePolicy
from modelexport.testtime.corruptions import corrupt
from modelexport.testtime.streams import StreamOrder

__all__ = [
    "CORRUPTED",
    "METHODS",
    "ORDERS",
    "ROBUST",
    "STREAM",
    "corrupted_sets",
    "for_batch",
    "matrix",
    "stream_accuracy",
    "summary",
]

CORRUPTED = tuple((name, s) for name in ("gaussian_noise", "contrast", "blur") for s in (3, 5))
ORDERS = ("shuffle", "class-sorted", "dirichlet:0.1")
#: Continual running statistics: the source counts as 128 examples, momentum 0.05 per batch of 64.
STREAM = {"bn_prior": 128.0, "momentum": 0.05, "episodic": False}
#: method -> {mode: policy}; mode "episodic" (reset per batch) or "continual" (one stream).
METHODS: dict[str, dict[str, TestTimePolicy]] = {
    "none": {"episodic": TestTimePolicy()},
    "bn": {"episodic": TestTimePolicy(ttt="bn"), "continual": TestTimePolicy(ttt="bn", episodic=False)},
    "bn-prior": {"episodic": TestTimePolicy(ttt="bn", bn_prior=128.0)},
    "bn-stream": {"continual": TestTimePolicy(ttt="bn", **STREAM)},
    "tent": {"episodic": TestTimePolicy(ttt="tent"), "continual": TestTimePolicy(ttt="tent", episodic=False)},
    "sar": {
        "episodic": TestTimePolicy(ttt="sar", bn_prior=128.0),
        "continual": TestTimePolicy(ttt="sar", **STREAM),
    },
}
ROBUST = ("bn-prior", "bn-stream", "sar")


def for_batch(policy: TestTimePolicy, batch: int) -> TestTimePolicy:
    """The same time constant at another batch size: momentum is per batch (stated for batches of 64)."""
    if policy.episodic or policy.momentum >= 1.0:
        return policy
    return policy.with_changes(momentum=1.0 - (1.0 - policy.momentum) ** (batch / 64))


def stream_accuracy(
    path: Path, policy: TestTimePolicy, x: np.ndarray, y: np.ndarray, order: str, batch: int, seed: int = 0
) -> tuple[float, int]:
    """Accuracy over one stream (one engine stream, batches in ``order``) and the collapse-guard resets."""
    idx = StreamOrder.parse(order, seed).indices(y)
    x, y = x[idx], y[idx]
    engine = TestTimeEngine(path, policy)
    stream = engine.new_stream()
    preds = np.concatenate(
        [engine.predict({"x": x[i : i + batch]}, stream).argmax(1) for i in range(0, len(x), batch)]
    )
    return float((preds == y).mean()), stream.resets


def corrupted_sets(x: np.ndarray, which: Iterable[tuple[str, int]] = CORRUPTED) -> dict[str, np.ndarray]:
    return {f"{name}@{s}": corrupt(x, name, s, seed=0) for name, s in which}


def matrix(
    path: Path,
    sets: dict[str, np.ndarray],
    y: np.ndarray,
    batches: Iterable[int] = (64, 1),
    orders: Iterable[str] = ORDERS,
    methods: Iterable[str] = tuple(METHODS),
) -> list[dict[str, object]]:
    """One row per (data, batch, order, method, mode): accuracy and collapse-guard resets."""
    rows: list[dict[str, object]] = []
    for batch in batches:
        for order in orders:
            for data, x in sets.items():
                for method in methods:
                    for mode, policy in METHODS[method].items():
                        acc, resets = stream_accuracy(path, for_batch(policy, batch), x, y, order, batch)
                        rows.append(
                            {
                                "data": data,
                                "batch": batch,
                                "order": order,
                                "method": method,
                                "mode": mode,
                                "accuracy": acc,
                                "resets": resets,
                            }
                        )
    return rows


def summary(rows: list[dict[str, object]]) -> dict[str, object]:
    """The issue's targets: recovery of the strongest corruption's loss (class-sorted, per batch size) by
    the best robust method, and the worst gap to plain inference per method."""
    acc = {(r["data"], r["batch"], r["order"], r["method"], r["mode"]): r["accuracy"] for r in rows}
    plain = {k[:3]: v for k, v in acc.items() if k[3] == "none"}
    out: dict[str, object] = {"recovered": {}, "worst_gap_to_plain": {}}
    for batch in sorted({int(r["batch"]) for r in rows}):  # type: ignore[call-overload]
        clean = plain.get(("clean", batch, "class-sorted"))
        severe = [d for d, b, o in plain if b == batch and o == "class-sorted" and str(d).endswith("@5")]
        if clean is None or not severe:
            continue
        strongest = min(severe, key=lambda d: plain[(d, batch, "class-sorted")])
        lost = clean - plain[(strongest, batch, "class-sorted")]
        best = {
            f"{m}/{mode}": (a - plain[(d, b, o)]) / lost
            for (d, b, o, m, mode), a in acc.items()
            if d == strongest and b == batch and o == "class-sorted" and m in ROBUST
        }
        name = max(best, key=best.get)  # type: ignore[arg-type]
        out["recovered"][f"batch {batch}"] = {
            "strongest": strongest,
            "lost": lost,
            "best": name,  # type: ignore[index]
            "fraction": best[name],
            "all": best,
        }
    for (d, b, o, m, mode), a in acc.items():
        gap = a - plain[(d, b, o)]
        key = f"{m}/{mode}"
        worst = out["worst_gap_to_plain"].get(key)  # type: ignore[attr-defined]
        if worst is None or gap < worst["gap"]:
            out["worst_gap_to_plain"][key] = {"gap": gap, "where": f"{d}, batch {b}, {o}"}  # type: ignore[index]
    return out
