"""What quantization cost: fp32 vs int8 agreement, accuracy, latency, and per-module output error.

The per-module report uses the tags: for each module (tag cut at ``depth`` segments) the tensors
it hands to the rest of the graph are made graph outputs in both models, so users see which module
loses precision and can ``--exclude-modules`` it.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ..hierarchy.tags import node_tag
from ..inference.feeds import SampleSet
from ..runtime.session import create_session

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["compare_models", "module_error_report", "run_samples", "time_session"]


def run_samples(
    model: onnx.ModelProto, samples: SampleSet, outputs: list[str] | None = None
) -> tuple[list[list[Any]], float]:
    """Outputs per sample, and the median seconds per sample."""
    sess, _ = create_session(model)
    results, times = [], []
    for feed in samples.feeds:
        start = time.perf_counter()
        results.append(sess.run(outputs, feed))
        times.append(time.perf_counter() - start)
    times.sort()
    return results, times[len(times) // 2] if times else 0.0


def time_session(
    model: onnx.ModelProto | str | os.PathLike[str],
    feed: dict[str, np.ndarray],
    repeat: int = 20,
    warmup: int = 3,
    threads: int = 0,
) -> float:
    """Median seconds of one run of ``feed`` (``threads`` intra-op threads; 0 lets ORT choose)."""
    sess, _ = create_session(model, intra_op_num_threads=threads)
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def _row_cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Cosine of each example's output (row of the batch axis), int8 vs fp32."""
    import numpy as np

    out = []
    for u, v in zip(
        a.astype(np.float64).reshape(len(a), -1), b.astype(np.float64).reshape(len(b), -1), strict=True
    ):
        denom = float(np.linalg.norm(u) * np.linalg.norm(v))
        out.append(float(u @ v / denom) if denom else 1.0)
    return out


def compare_models(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, samples: SampleSet
) -> dict[str, Any]:
    """Agreement of the first output (argmax for logits, cosine otherwise), accuracy with labels, latency ratio.

    Feeds may hold batches (padded per batch); every statistic is per example.
    """
    import numpy as np

    ref, t_ref = run_samples(reference, samples)
    cand, t_cand = run_samples(candidate, samples)
    a = [r[0] for r in ref]
    b = [c[0] for c in cand]
    out: dict[str, Any] = {
        "samples": len(samples),
        "max_abs_diff": float(
            max(np.max(np.abs(x.astype(np.float64) - y)) for x, y in zip(a, b, strict=True))
        ),
        "mean_cosine": float(np.mean([c for x, y in zip(a, b, strict=True) for c in _row_cosines(x, y)])),
        "latency_fp32_ms": round(t_ref * 1e3, 4),
        "latency_quantized_ms": round(t_cand * 1e3, 4),
        "speedup": round(t_ref / t_cand, 3) if t_cand else None,
    }
    if a[0].ndim == 2 and a[0].shape[-1] > 1:  # logits: compare decisions
        pa = np.concatenate([x.argmax(-1) for x in a])
        pb = np.concatenate([y.argmax(-1) for y in b])
        out["agreement"] = float(np.mean(pa == pb))
        if samples.labels is not None:
            labels = np.asarray(samples.labels)
            out["accuracy_fp32"] = float(np.mean(pa == labels))
            out["accuracy_quantized"] = float(np.mean(pb == labels))
    return out


def _boundaries(model: onnx.ModelProto, depth: int) -> dict[str, list[str]]:
    """Module (tag cut at ``depth``) -> float tensors its nodes hand to other modules or the graph output."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {
        vi.name
        for vi in [*inferred.graph.value_info, *inferred.graph.output]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    module_of: dict[str, str] = {}
    produced: dict[str, str] = {}
    for node in model.graph.node:
        tag = node_tag(node)
        if not tag:
            continue
        parts = tag[1:].split("/")
        if len(parts) < depth:
            continue  # glue at a shallower level (root casts, reshapes) is no module of this depth
        module = "/" + "/".join(parts[:depth])
        for out in node.output:
            produced[out], module_of[out] = module, module
    crossing: dict[str, set[str]] = defaultdict(set)
    graph_outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        tag = node_tag(node) or ""
        here = "/" + "/".join(tag[1:].split("/")[:depth])
        for inp in node.input:
            if inp in produced and produced[inp] != here:
                crossing[produced[inp]].add(inp)
    for name in graph_outputs & set(produced):
        crossing[produced[name]].add(name)
    return {m: sorted(t for t in ts if t in floats) for m, ts in crossing.items()}


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    for name in names:
        if name not in existing:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return copy


def module_error_report(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    samples: SampleSet,
    depth: int = 2,
    max_samples: int = 16,
) -> list[dict[str, Any]]:
    """Per module: max / mean abs error of its output tensors, candidate vs reference, worst first."""
    import numpy as np

    present = {o for n in candidate.graph.node for o in n.output}
    bounds = {m: [t for t in ts if t in present] for m, ts in _boundaries(reference, depth).items()}
    names = sorted({t for ts in bounds.values() for t in ts})
    if not names:
        return []
    subset = SampleSet(samples.feeds[:max_samples], None, samples.kind)
    ref, _ = run_samples(_with_outputs(reference, names), subset, names)
    cand, _ = run_samples(_with_outputs(candidate, names), subset, names)
    index = {n: i for i, n in enumerate(names)}
    report = []
    for module, tensors in bounds.items():
        if not tensors:
            continue
        diffs = [
            np.abs(r[index[t]].astype(np.float64) - c[index[t]])
            for r, c in zip(ref, cand, strict=True)
            for t in tensors
        ]
        report.append(
            {
                "module": module,
                "tensors": len(tensors),
                "max_abs_error": float(max(d.max() for d in diffs)),
                "mean_abs_error": float(np.mean([d.mean() for d in diffs])),
            }
        )
    return sorted(report, key=lambda r: r["max_abs_error"], reverse=True)
