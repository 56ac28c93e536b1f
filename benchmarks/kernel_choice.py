"""Kernel choice on the CPU provider: ``SkipLayerNormalization`` vs ``Add`` + ``LayerNormalization``.

Why ``-O2`` splits the fused skip normalization for CPU deployment and ``modelexport``'s CPU sessions leave
out ORT's ``SkipLayerNormFusion`` (``optimize/skip_norm.py``, ``runtime/session.py``): the same residual
add and normalization as one ``com.microsoft.SkipLayerNormalization`` node and as the two standard ops
(ORT's fusion disabled so they stay two), on the shapes of MiniLM, a ViT and BERT-base (tokens x hidden),
1 thread and all threads, interleaved; the ratio fused / split is printed and written to
``benchmarks/results/kernel_choice.json``. Also for ``SkipSimplifiedLayerNormalization`` (RMSNorm models),
which ``-O2`` also splits: its ratio is printed so the choice can be checked on another machine.

Also measured: **weight streaming**, a chain of ``MatMul``s with one MiniLM layer's weight shapes (QKV,
output, feed-forward in and out) repeated for 1 to 8 layers, on 16 rows (MiniLM at batch 1 x 16), one
thread: GFLOP/s while the weights fit in the CPU's last-level cache and once they do not. Why the fp32
graph latency of a small encoder at batch 1 is bounded by its GEMMs (``fusion_latency.py``'s floor).

    python benchmarks/kernel_choice.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, timed, write_results  # noqa: E402

#: (tokens, hidden): one decoding step, MiniLM 1x16 and 8x128, ViT-Tiny (197 patches), BERT-base 1x128 and 32x128.
SHAPES = ((1, 768), (16, 384), (1024, 384), (197, 192), (128, 768), (4096, 768))


def _models(tokens: int, hidden: int, simplified: bool) -> tuple[bytes, bytes]:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    norm = "SimplifiedLayerNormalization" if simplified else "LayerNormalization"
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "gamma")]
    if not simplified:
        inits.append(numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta"))
    params = [i.name for i in inits]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, tokens, hidden]) for n in ("x", "skip")]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    fused = helper.make_node(
        f"Skip{norm}", ["x", "skip", *params], ["y"], domain="com.microsoft", epsilon=1e-6
    )
    split = [
        helper.make_node("Add", ["x", "skip"], ["sum"]),
        helper.make_node(norm, ["sum", *params], ["y"], axis=-1, epsilon=1e-6),
    ]
    return tuple(  # type: ignore[return-value]
        helper.make_model(
            helper.make_graph(nodes, "g", io, out, inits), opset_imports=opsets
        ).SerializeToString()
        for nodes in ([fused], split)
    )


def _row(tokens: int, hidden: int, simplified: bool, threads: int, rounds: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    fused, split = _models(tokens, hidden, simplified)
    sessions = {
        "fused": ort.InferenceSession(fused, opts, providers=["CPUExecutionProvider"]),
        "split": ort.InferenceSession(
            split, opts, providers=["CPUExecutionProvider"], disabled_optimizers=["SkipLayerNormFusion"]
        ),
    }
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((1, tokens, hidden)).astype(np.float32) for n in ("x", "skip")}
    outs = {k: s.run(None, feeds)[0] for k, s in sessions.items()}
    repeats = max(5, 20000 // tokens)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for k, s in sessions.items():
            times[k] += timed(lambda s=s: s.run(None, feeds), repeats)
    us = {k: round(median(t) * 1e6, 2) for k, t in times.items()}
    return {
        "op": "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization",
        "tokens": tokens,
        "hidden": hidden,
        "threads": threads or "all",
        "median_us": us,
        "fused_vs_split": round(us["fused"] / us["split"], 3),
        "max_abs_diff": float(np.abs(outs["fused"] - outs["split"]).max()),
    }


#: One MiniLM layer's weight matrices (K, N): QKV, attention output, feed-forward in and out.
LAYER = ((384, 1152), (384, 384), (384, 1536), (1536, 384))


def _streaming(layers: int, rows: int, threads: int, rounds: int) -> dict[str, Any]:
    """GFLOP/s of ``layers`` x ``LAYER`` chained ``MatMul``s on ``rows`` rows (weights prepacked by ORT)."""
    import time

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        for j, (k, n) in enumerate(LAYER):
            w = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"w{i}_{j}")
            inits.append(w)
            nodes.append(helper.make_node("MatMul", [x if j != 1 else f"y{i}_0s", w.name], [f"y{i}_{j}"]))
            if j == 0:  # QKV -> the first third feeds the output projection (shapes as in the layer)
                nodes.append(helper.make_node("Slice", [f"y{i}_0", "zero", "hidden", "last"], [f"y{i}_0s"]))
            x = f"y{i}_{j}" if j != 0 else x
        x = f"y{i}_3"
    consts = [
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("hidden", TensorProto.INT64, [1], [384]),
        helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "stream",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 384])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
        inits + consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal((rows, 384)).astype(np.float32)}
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(20):
            sess.run(None, feeds)
        times.append((time.perf_counter() - start) / 20)
    flops = 2 * rows * layers * sum(k * n for k, n in LAYER)
    weights_mb = layers * sum(k * n for k, n in LAYER) * 4 / 1e6
    return {
        "layers": layers,
        "weights_mb": round(weights_mb, 1),
        "rows": rows,
        "median_ms": round(median(times) * 1e3, 3),
        "gflops": round(flops / median(times) / 1e9, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    args = parser.parse_args()
    rows = [
        _row(t, h, simplified, threads, args.rounds)
        for simplified in (False, True)
        for threads in map(int, args.threads.split(","))
        for t, h in SHAPES
    ]
    for r in rows:
        print(
            f"{r['op']:<33} {r['tokens']:>5}x{r['hidden']:<4} threads {r['threads']!s:>3}: fused {r['median_us']['fused']:9.1f} us"
            f"  split {r['median_us']['split']:9.1f} us  fused/split {r['fused_vs_split']:.2f}"
        )
    streaming = [_streaming(layers, 16, 1, args.rounds) for layers in (1, 2, 3, 4, 6, 8)]
    for r in streaming:
        print(
            f"weight streaming: {r['layers']} MiniLM-shaped layer(s), {r['weights_mb']:5.1f} MB of weights, "
            f"{r['rows']} rows, 1 thread: {r['median_ms']:7.3f} ms  {r['gflops']:6.1f} GFLOP/s"
        )
    payload = {"rounds": args.rounds, "rows": rows, "weight_streaming": streaming}
    print(f"wrote {write_results('kernel_choice', payload)}")


if __name__ == "__main__":
    main()
