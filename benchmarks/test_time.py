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
``held-out`` (severity 4; shuffled, class-sorted, Dirichlet 0.03, 0.3, 3; batches 48 and 1 -- measured
after the first design was final) or ``final`` (networks never tuned on: the image pipeline's own, trained on
a PNG folder of digits with seed 1 and on the drawn shapes; severities 2 and 4 and the issue's noise 2 +
contrast 2; as read, shuffled, class-sorted, Dirichlet 0.05, 0.5; batches 40 and 1 -- measured once, at the
end). Writes benchmarks/results/test_time_streams_<grid>.json. Trained models and corrupted sets are cached
in benchmarks/results/cache/ (``--fresh`` retrains).

    python benchmarks/test_time.py [--batches 1,32] [--repeats 200] [--threads 1]
    python benchmarks/test_time.py --streams [--grid development|held-out|final] [--datasets digits,shapes]
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
#: Batches per timed round of the stream cost.
BLOCK = 32
#: The stream cost's clock: CPU time of this thread (``--threads 1``: ONNX Runtime and torch run here).
CLOCK = time.thread_time
CACHE = Path(__file__).resolve().parent / "results" / "cache" / "test_time_streams"
#: The corruptions the pipeline networks' folders are written with (severities 2-5; and the issue's combination).
PIPELINE_CORRUPTED = tuple((k, s) for k in ("gaussian_noise", "contrast", "blur") for s in (2, 3, 4, 5))


def _stream_ms(
    engines: dict[str, Any], batches: list[dict[str, np.ndarray]], repeats: int
) -> dict[str, float]:
    """Milliseconds per batch along one stream per engine, amortized: each round streams ``BLOCK`` distinct
    batches through every engine in turn (a block at batch 32 spans two gradient steps of tent/sar), and the
    median over the rounds of the block's mean is reported. Timed in CPU time of the calling thread, which
    runs ONNX Runtime and torch at one thread (``--threads 1``): time the process spends waiting for a
    core on a shared machine is not counted."""
    streams = {name: engine.new_stream() for name, engine in engines.items()}
    for name, engine in engines.items():  # warm-up: sessions, the memory filling
        for feeds in batches[:8]:
            engine.predict(feeds, streams[name])
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(max(3, repeats // BLOCK)):
        for name, engine in engines.items():
            block = [batches[(r * BLOCK + i) % len(batches)] for i in range(BLOCK)]
            start = CLOCK()
            for feeds in block:
                engine.predict(feeds, streams[name])
            times[name].append((CLOCK() - start) / BLOCK)
    return {name: median(t) * 1000.0 for name, t in times.items()}


def _measure(
    path: Path, x: np.ndarray, batch: int, repeats: int, threads: int
) -> dict[str, dict[str, float]]:
    """Cost of each policy on batches of ``batch`` drawn from ``x`` (a shuffled stream of it)."""
    from modelexport.errors import TestTimeError
    from modelexport.runtime.session import SessionConfig
    from modelexport.testtime import TestTimeEngine, TestTimePolicy

    config = SessionConfig(intra_op_num_threads=threads)
    rng = np.random.default_rng(0)
    name = TestTimeEngine(path, session_config=config).input_name
    order = rng.permutation(np.resize(np.arange(len(x)), max(len(x), 64 * batch)))
    batches = [{name: x[order[i : i + batch]]} for i in range(0, 64 * batch, batch)]
    feeds = batches[0]

    def bench(policy: TestTimePolicy, n: int = repeats) -> float:
        engine = TestTimeEngine(path, policy, session_config=config)
        engine.predict(feeds)  # warm-up
        return median(timed(lambda: engine.predict(feeds), n)) * 1000.0

    engines = {"single_run": TestTimeEngine(path, TestTimePolicy(), session_config=config)}
    engines.update(
        {m: TestTimeEngine(path, TestTimePolicy(ttt=m), session_config=config) for m in ADAPTATION}
    )
    ms = _stream_ms(engines, batches, repeats)
    ms["tta_batched"] = bench(TestTimePolicy(tta_transforms=VIEWS), max(4, repeats // 4))
    ms["tta_sequential"] = bench(TestTimePolicy(tta_transforms=VIEWS, batched=False), max(4, repeats // 4))
    try:
        ms["mc16_batched"] = bench(TestTimePolicy(mc_dropout=16), max(4, repeats // 4))
        ms["mc16_sequential"] = bench(TestTimePolicy(mc_dropout=16, batched=False), max(4, repeats // 4))
    except TestTimeError:  # exported without Dropout (the pipeline's package)
        ms["mc16_batched"] = ms["mc16_sequential"] = float("nan")
    ratios = {f"{m}_vs_plain": ms[m] / ms["single_run"] for m in ADAPTATION}
    ratios.update(
        {
            "tta_batched_vs_single": ms["tta_batched"] / ms["single_run"],
            "tta_sequential_vs_single": ms["tta_sequential"] / ms["single_run"],
            "tta_batched_vs_sequential": ms["tta_batched"] / ms["tta_sequential"],
            "mc16_batched_vs_sequential": ms["mc16_batched"] / ms["mc16_sequential"],
        }
    )
    return {"ms_per_batch": ms, "ratios": ratios}


#: The trained networks the cost is measured on: name -> (cached dataset, the set it is streamed).
TRAINED = {
    "digits": ("digits", "clean"),
    "pipeline": ("pipeline-digits", "clean"),
    "pipeline-noisy": ("pipeline-digits", "gaussian_noise@4"),  # the input denoising blurs most examples
}


def _untrained() -> dict[str, tuple[object, tuple[int, ...]]]:
    """The untrained CNNs of the cost table (name -> (module, input shape)), exported with their Dropout."""
    import torch
    from tests.models.torch_models import SmallCNN
    from torch import nn

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
    return {
        "small": (SmallCNN(in_channels=3, num_classes=10).eval(), (3, 32, 32)),
        "medium": (MediumCNN().eval(), (3, 64, 64)),
    }


def _cost_cases(tmp: Path, models: list[str]) -> dict[str, tuple[Path, np.ndarray]]:
    """name -> (model, the images it is streamed): the trained digits CNN and the image pipeline's own
    network (trained on the digits folder, tests/testtime/pipeline_folder.py) on their clean test images
    (``pipeline-noisy``: the same network on Gaussian noise 4, where the input denoising works) --
    a trained model's predictions spread over the classes; the untrained small and medium CNNs on random
    images, whose predictions collapse, so the lazy guard runs the source model now and then."""
    import modelexport

    untrained = _untrained()
    unknown = sorted(set(models) - {*TRAINED, *untrained})
    if unknown:
        raise SystemExit(f"unknown --models {unknown}; choose from {[*TRAINED, *untrained]}")
    cases: dict[str, tuple[Path, np.ndarray]] = {}
    for name in (m for m in TRAINED if m in models):
        dataset, key = TRAINED[name]
        path, sets, _ = _dataset(dataset, False)
        cases[name] = (path, sets[key])
    rng = np.random.default_rng(0)
    for name, (model, shape) in untrained.items():
        if name in models:
            export = modelexport.export(
                model, tmp / name, keep_batchnorm=True, keep_dropout=True, input_shape=(1, *shape)
            )
            cases[name] = (export.onnx_path, rng.standard_normal((512, *shape)).astype(np.float32))
    return cases


def cost(batches: list[int], repeats: int, threads: int, models: list[str]) -> int:
    results: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, x) in _cost_cases(Path(tmp), models).items():
            results[name] = {b: _measure(path, x, b, repeats, threads) for b in batches}
    print("| model | batch | plain ms | bn | tent | sar | TTA x9 batched | MC x16 batched |")
    print("|---|---|---|---|---|---|---|---|")
    for name, by_batch in results.items():
        for batch, r in by_batch.items():
            ms, ratio = r["ms_per_batch"], r["ratios"]
            cells = " | ".join(f"{ratio[f'{m}_vs_plain']:.2f}x" for m in ADAPTATION)
            mc = ms["mc16_batched"] / ms["single_run"]
            print(
                f"| {name} | {batch} | {ms['single_run']:.3f} | {cells} | "
                f"{ratio['tta_batched_vs_single']:.2f}x | {'-' if np.isnan(mc) else f'{mc:.2f}x'} |"
            )
    print(
        f"ms per batch along a stream: median over rounds of the mean of {BLOCK} batches, every method in "
        f"each round ({max(3, repeats // BLOCK)} rounds), {threads} thread(s)"
    )
    out = write_results(
        "test_time",
        {"views": len(VIEWS) + 1, "repeats": repeats, "threads": threads, "models": results},
    )
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------------------ streams


def _dataset(name: str, fresh: bool) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """A trained network's export and the clean + corrupted held-out sets, cached between runs: ``digits`` and
    ``shapes`` (the tests' networks), ``pipeline-digits[-sN]`` and ``pipeline-shapes`` (the image pipeline's
    own network trained on a PNG folder, seed N; tests/testtime/pipeline_folder.py)."""
    import shutil

    from tests.testtime.robustness import COMBINED, corrupted_sets

    import modelexport

    folder = CACHE / name
    if fresh and folder.exists():
        shutil.rmtree(folder)
    if name.startswith("pipeline-"):
        from tests.testtime.pipeline_folder import pipeline_model

        source, _, suffix = name.removeprefix("pipeline-").partition("-s")
        corruptions = (*(f"{k}@{s}" for k, s in PIPELINE_CORRUPTED), COMBINED)
        built = pipeline_model(folder, source, corruptions, seed=int(suffix or 0))
        return built.onnx_path, built.sets, built.labels
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
    from tests.testtime.robustness import COMBINED, GRIDS, ROUND_SEEDS, TUNED, matrix, rows, summary

    grid = GRIDS[grid_name]
    wanted = {"clean", *(f"{n}@{s}" for n, s in grid.sets()), *([COMBINED] if grid_name == "final" else [])}
    start = time.perf_counter()
    cells = []
    for name in datasets:
        path, sets, y = _dataset(name, fresh)
        sets = {k: v for k, v in sets.items() if k in wanted and (not data or k in data)}
        cells += matrix(
            name, path, sets, y, grid.batches, grid.orders, ["none", *methods], ROUND_SEEDS[grid_name]
        )
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
        "--models", default="digits,pipeline,pipeline-noisy,small,medium", help="cost: the networks"
    )
    parser.add_argument(
        "--streams", action="store_true", help="the stream-robustness accuracy matrix instead"
    )
    parser.add_argument("--grid", default="development", help="--streams: development, held-out or final")
    parser.add_argument(
        "--datasets",
        default="",
        help="--streams: digits, shapes, pipeline-digits[-sN], pipeline-shapes (default: the grid's round)",
    )
    parser.add_argument("--methods", default="bn,tent,sar,bn-exact", help="--streams: besides plain")
    parser.add_argument("--fresh", action="store_true", help="--streams: retrain the cached networks")
    parser.add_argument("--data", default="", help="--streams: only these sets (e.g. clean,contrast@3)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.streams:
        from tests.testtime.robustness import ROUND_DATASETS

        return streams(
            args.grid,
            args.datasets.split(",") if args.datasets else list(ROUND_DATASETS[args.grid]),
            args.methods.split(","),
            args.fresh,
            [d for d in args.data.split(",") if d],
        )
    return cost([int(b) for b in args.batches.split(",")], args.repeats, args.threads, args.models.split(","))


if __name__ == "__main__":
    raise SystemExit(main())
