"""Wall time of ``modelexport analyze`` on a BERT-base-sized model (110M parameters, random weights).

Exports ``BertModel(BertConfig())`` once with modelexport (tags and sidecar), then times the whole
analysis, load included, in a fresh read each repeat, in the library and as the CLI command
(Python start-up included). Target: under 3 s. Prints the times and writes
benchmarks/results/analyze_speed.json.

    python benchmarks/analyze_speed.py [--repeats 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, timed, write_results  # noqa: E402

TARGET_S = 3.0


def export_bert_base(out_dir: Path) -> Path:
    import transformers

    import modelexport

    if (out_dir / "model.onnx").is_file():
        return out_dir / "model.onnx"
    model = transformers.BertModel(transformers.BertConfig()).eval()
    return modelexport.export(model, out_dir, validate=False).onnx_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--keep", type=Path, default=None, help="Export folder to reuse/keep (default: a temp dir)."
    )
    args = parser.parse_args()
    from modelexport.inspect.analyze import analyze
    from modelexport.inspect.formats import render

    with tempfile.TemporaryDirectory(prefix="analyze-speed-") as tmp:
        onnx_path = export_bert_base(args.keep or Path(tmp) / "bert-base")
        size = onnx_path.stat().st_size
        result = analyze(onnx_path)
        times = timed(lambda: render("analyze", "summary", analyze(onnx_path)), args.repeats)
        cli = [sys.executable, "-m", "modelexport", "analyze", str(onnx_path)]
        cli_times = timed(lambda: subprocess.run(cli, check=True, capture_output=True), args.repeats)
    payload = {
        "model": "BertModel(BertConfig()) random weights",
        "parameters": result.parameters,
        "nodes": result.total_nodes,
        "module_tags": len(result.modules),
        "onnx_bytes": size,
        "seconds": times,
        "median_s": median(times),
        "cli_seconds": cli_times,
        "cli_median_s": median(cli_times),
        "target_s": TARGET_S,
        "ok": median(cli_times) < TARGET_S,
    }
    path = write_results("analyze_speed", payload)
    print(
        f"analyze BERT-base ({result.parameters / 1e6:.1f}M params, {result.total_nodes} nodes, {size / 1e6:.0f} MB): "
        f"median {median(times):.2f} s in the library, {median(cli_times):.2f} s for the whole CLI command "
        f"over {args.repeats} runs (target < {TARGET_S} s) -> {path}"
    )


if __name__ == "__main__":
    main()
