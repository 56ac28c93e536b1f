"""Test-time compute on ONNX Runtime: what it costs, and what adaptation recovers on real streams.

Default (cost): K-view TTA batched vs sequential vs one plain run, MC-dropout passes batched vs sequential,
and the adaptation methods with their default options (``--ttt bn|tent|sar``: continual, memory
statistics) per batch of a stream, against plain inference with the same engine API. Models: the digits CNN
(1x8x8, 15 us a sample: per-call overhead dominates), the image pipeline's CompactCNN (width 64, 1x8x8:
the network of the issue's measurement), ``small`` (tests' SmallCNN, 3x32x32) and ``medium`` (3x64x64).
Writes benchmarks/results/test_time.json.

``--streams``: accuracy instead of cost -- method x stream order x corruption x batch size, with the share
of each corruption's loss recovered (tests/testtime/robustness.py): the digits CNN on digits and the
CompactCNN on a drawn-shapes dataset (tests/testtime/shapes.py), noise/contrast/blur + clean, in the
``--grid``'s severities, orders and batch sizes: ``development`` (severities 3 and 5; shuffled,
class-sorted, Dirichlet 0.01, 0.1, 1; batches 64, 32, 1 -- the defaults were tuned on part of it) or
``held-out`` (severity 4; shuffled, class-sorted, Dirichlet 0.03, 0.3, 3; batches 48 and 1 -- measured once,
after the defaults were final). Writes benchmarks/results/test_time_streams_<grid>.json. Trained models and
corrupted sets are cached in benchmarks/results/cache/ (``--fresh`` retrains).

    python benchmarks/test_time.py [--batches 1,32] [--repeats 200] [--threads 1]
    python benchmarks/test_time.py --streams [--grid development|held-out] [--datasets digits,shapes]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import median, timed, write_results  # noqa: E402

VIEWS = (
    "identity",
    "hflip",
    "vflip",
    "rot90",
    "rot180",
    "rot270",
    "contrast",
)  # 8 views (contrast gives two)
ADAPTATION = ("bn", "tent", "sar")
CACHE = Path(__file__).resolve().parent / "results" / "cache" / "test_time_streams"


def _stream_ms(engine: Any, batches: list[dict[str, np.ndarray]], repeats: int) -> tuple[float, float]:
    """(median, mean) ms per batch along one stream of distinct batches, after a warm-up on it."""
    stream = engine.new_stream()
    for feeds in batches[:8]:
        engine.predict(feeds, stream)
    times = timed_stream(engine, batches, stream, repeats)
    return median(times) * 1000.0, float(np.mean(times)) * 1000.0


def timed_stream(engine: Any, batches: list[dict[str, np.ndarray]], stream: Any, repeats: int) -> list[float]:
    out = []
    for i in range(repeats):
        feeds = batches[i % len(batches)]
        start = time.perf_counter()
        engine.predict(feeds, stream)
        out.append(time.perf_counter() - start)
    return out


def _measure(
    path: Path, shape: tuple[int, ...], batch: int, repeats: int, threads: int
) -> dict[str, dict[str, float]]:
    from modelexport.runtime.session import SessionConfig
    from modelexport.testtime import TestTimeEngine, TestTimePolicy

    config = SessionConfig(intra_op_num_threads=threads)
    rng = np.random.default_rng(0)
    name = TestTimeEngine(path, session_config=config).input_name
    batches = [{name: rng.standard_normal((batch, *shape)).astype(np.float32)} for _ in range(32)]
    feeds = batches[0]

    def bench(policy: TestTimePolicy, n: int = repeats) -> float:
        engine = TestTimeEngine(path, policy, session_config=config)
        engine.predict(feeds)  # warm-up
        return median(timed(lambda: engine.predict(feeds), n)) * 1000.0

    plain = TestTimeEngine(path, TestTimePolicy(), session_config=config)
    ms: dict[str, float] = {}
    ms["single_run"], ms["single_run_mean"] = _stream_ms(plain, batches, repeats)
    for method in ADAPTATION:  # steady state along one stream (the default: continual)
        engine = TestTimeEngine(path, TestTimePolicy(ttt=method), session_config=config)
        n = repeats if method == "bn" else max(8, repeats // 10)
        ms[method], ms[f"{method}_mean"] = _stream_ms(engine, batches, n)
    ms["tta_batched"] = bench(TestTimePolicy(tta_transforms=VIEWS), max(4, repeats // 4))
    ms["tta_sequential"] = bench(TestTimePolicy(tta_transforms=VIEWS, batched=False), max(4, repeats // 4))
    ms["mc16_batched"] = bench(TestTimePolicy(mc_dropout=16), max(4, repeats // 4))
    ms["mc16_sequential"] = bench(TestTimePolicy(mc_dropout=16, batched=False), max(4, repeats // 4))
    ratios = {f"{m}_vs_plain": ms[m] / ms["single_run"] for m in ADAPTATION}
    ratios.update({f"{m}_vs_plain_mean": ms[f"{m}_mean"] / ms["single_run_mean"] for m in ADAPTATION})
    ratios.update(
        {
            "tta_batched_vs_single": ms["tta_batched"] / ms["single_run"],
            "tta_sequential_vs_single": ms["tta_sequential"] / ms["single_run"],
            "tta_batched_vs_sequential": ms["tta_batched"] / ms["tta_sequential"],
            "mc16_batched_vs_sequential": ms["mc16_batched"] / ms["mc16_sequential"],
        }
    )
    return {"ms_per_batch": ms, "ratios": ratios}


def _models() -> dict[str, tuple[object, tuple[int, ...], dict[str, Any]]]:
    import torch
    from tests.models.torch_models import SmallCNN
    from tests.testtime.digits import DigitsCNN
    from torch import nn

    from modelexport.train.cnn import CompactCNN

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)
        )

    class MediumCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
            self.dropout = nn.Dropout(0.2)
            self.head = nn.Linear(128, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.dropout(self.features(x).mean(dim=(2, 3))))

    torch.manual_seed(0)
    dropout = {"keep_dropout": True}
    return {
        "digits": (DigitsCNN().eval(), (1, 8, 8), dropout),
        "pipeline": (CompactCNN(1, 10, (8, 8)).eval(), (1, 8, 8), dropout),
        "small": (SmallCNN(in_channels=3, num_classes=10).eval(), (3, 32, 32), dropout),
        "medium": (MediumCNN().eval(), (3, 64, 64), dropout),
    }


def cost(batches: list[int], repeats: int, threads: int) -> int:
    import modelexport

    results: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, shape, options) in _models().items():
            export = modelexport.export(
                model, Path(tmp) / name, keep_batchnorm=True, input_shape=(1, *shape), **options
            )
            results[name] = {b: _measure(export.onnx_path, shape, b, repeats, threads) for b in batches}
    print("| model | batch | plain ms | bn | tent | sar | TTA x9 batched | MC x16 batched |")
    print("|---|---|---|---|---|---|---|---|")
    for name, by_batch in results.items():
        for batch, r in by_batch.items():
            ms, ratio = r["ms_per_batch"], r["ratios"]
            cells = " | ".join(f"{ratio[f'{m}_vs_plain']:.2f}x" for m in ADAPTATION)
            print(
                f"| {name} | {batch} | {ms['single_run']:.3f} | {cells} | "
                f"{ratio['tta_batched_vs_single']:.2f}x | {ms['mc16_batched'] / ms['single_run']:.2f}x |"
            )
    print(
        f"medians over a stream of {repeats} batches (tent, sar: {max(8, repeats // 10)}), {threads} thread(s)"
    )
    out = write_results(
        "test_time",
        {"views": len(VIEWS) + 1, "repeats": repeats, "threads": threads, "models": results},
    )
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------------------ streams


def _dataset(name: str, fresh: bool) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """A trained network's export and the clean + corrupted held-out sets, cached between runs."""
    import shutil

    from tests.testtime.robustness import corrupted_sets

    import modelexport

    folder = CACHE / name
    if fresh and folder.exists():
        shutil.rmtree(folder)
    onnx, npz = folder / "export" / "model.onnx", folder / "sets.npz"
    if npz.exists() and set(corrupted_sets(np.zeros((1, 1, 8, 8), np.float32))) - set(np.load(npz).files):
        npz.unlink()  # written before a severity was added
    if not (onnx.exists() and npz.exists()):
        if name == "digits":
            from tests.testtime.digits import load_digits_data, train_digits_cnn

            data, side = load_digits_data(), 8
            model = train_digits_cnn(data)
        else:
            from tests.testtime.shapes import load_shapes_data, train_shapes_cnn

            data, side = load_shapes_data(), 16
            model = train_shapes_cnn(data)
        export = modelexport.export(
            model, folder / "export", keep_batchnorm=True, input_shape=(1, 1, side, side)
        )
        assert export.onnx_path == onnx
        np.savez(npz, y=data.y_test, clean=data.x_test, **corrupted_sets(data.x_test))
    stored = np.load(npz)
    return onnx, {k: stored[k] for k in stored.files if k != "y"}, stored["y"]


def _print_streams(cells: list[Any]) -> None:
    from tests.testtime.robustness import held_out, recovery

    rec = recovery(cells)
    methods = list(dict.fromkeys(c.method for c in cells))
    acc = {(*c.key, c.method): c.accuracy for c in cells}
    for dataset in dict.fromkeys(c.dataset for c in cells):
        for batch in dict.fromkeys(c.batch for c in cells if c.dataset == dataset):
            print(
                f"\n{dataset}, batch {batch}: accuracy (share of the loss recovered); * = held out from tuning"
            )
            print("| data | order | " + " | ".join(methods) + " |")
            print("|---|---|" + "---|" * len(methods))
            keys = dict.fromkeys(
                (c.data, c.order) for c in cells if c.dataset == dataset and c.batch == batch
            )
            for data, order in keys:
                parts = []
                for m in methods:
                    a = acc.get((dataset, data, order, batch, m))
                    r = rec.get((dataset, data, order, batch, m))
                    parts.append("-" if a is None else f"{a:.3f}" + (f" ({r:.0%})" if r is not None else ""))
                star = "*" if held_out(dataset, data, order, batch) else ""
                print(f"| {data}{star} | {order} | " + " | ".join(parts) + " |")


def streams(grid_name: str, datasets: list[str], methods: list[str], fresh: bool, data: list[str]) -> int:
    """The stream matrix of one grid (tests/testtime/robustness.py) and the issue's targets per method."""
    from tests.testtime.robustness import GRIDS, TUNED, matrix, rows, summary

    grid = GRIDS[grid_name]
    wanted = {"clean", *(f"{n}@{s}" for n, s in grid.sets())}
    start = time.perf_counter()
    cells = []
    for name in datasets:
        path, sets, y = _dataset(name, fresh)
        sets = {k: v for k, v in sets.items() if k in wanted and (not data or k in data)}
        cells += matrix(name, path, sets, y, grid.batches, grid.orders, ["none", *methods])
        print(f"{name}: {len(cells)} streams, {time.perf_counter() - start:.0f} s", flush=True)
    seconds = time.perf_counter() - start
    _print_streams(cells)
    result = summary(cells)
    print(json.dumps(result, indent=2))
    print(f"{len(cells)} streams in {seconds:.0f} s")
    out = write_results(
        f"test_time_streams_{grid_name}",
        {
            "grid": grid_name,
            "seconds": seconds,
            "tuned_on": sorted(" ".join(map(str, k)) for k in TUNED),
            "summary": result,
            "rows": rows(cells),
        },
    )
    print(f"wrote {out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32", help="cost: batch sizes to measure")
    parser.add_argument("--repeats", type=int, default=200, help="cost: batches per measurement")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op and torch threads")
    parser.add_argument(
        "--streams", action="store_true", help="the stream-robustness accuracy matrix instead"
    )
    parser.add_argument("--grid", default="development", help="--streams: development or held-out")
    parser.add_argument("--datasets", default="digits,shapes", help="--streams: digits, shapes")
    parser.add_argument("--methods", default="bn,tent,sar,bn-exact", help="--streams: besides plain")
    parser.add_argument("--fresh", action="store_true", help="--streams: retrain the cached networks")
    parser.add_argument("--data", default="", help="--streams: only these sets (e.g. clean,contrast@3)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.streams:
        return streams(
            args.grid,
            args.datasets.split(","),
            args.methods.split(","),
            args.fresh,
            [d for d in args.data.split(",") if d],
        )
    return cost([int(b) for b in args.batches.split(",")], args.repeats, args.threads)


if __name__ == "__main__":
    raise SystemExit(main())
