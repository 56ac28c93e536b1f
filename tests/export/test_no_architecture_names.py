"""MUST: the exporter and the tagging know no architectures; they follow universal PyTorch principles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "modelexport"
SCANNED = [ROOT / "hierarchy", ROOT / "export"]
#: The vision-language runtime reads what differs between models from the package, not from names.
SCANNED_FILES = [
    ROOT / "inference" / "multimodal.py",
    ROOT / "inference" / "pipelines" / "vlm.py",
    ROOT / "inference" / "processors" / "vision_text.py",
]
ARCHITECTURES = [
    "bert",
    "gpt",
    "llama",
    "t5",
    "bart",
    "vit",
    "resnet",
    "whisper",
    "wav2vec",
    "qwen",
    "roberta",
    "mistral",
    "falcon",
    "opt",
    "bloom",
    "clip",
    "swin",
    "deit",
    "electra",
    "albert",
    "distilbert",
    "mobilenet",
    "efficientnet",
    "beit",
    "wavlm",
    "siglip",
    "mixtral",
    "hubert",
    "deberta",
    "llava",
    "idefics",
    "smolvlm",
    "gemma",
    "paligemma",
    "pixtral",
    "mllama",
]
PATTERN = re.compile(r"(?<![a-z])(" + "|".join(ARCHITECTURES) + r")(?![a-z])", re.IGNORECASE)


@pytest.mark.must
def test_no_architecture_names_in_export_or_tagging_code() -> None:
    hits = []
    for path in [p for folder in SCANNED for p in folder.rglob("*.py")] + SCANNED_FILES:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for m in PATTERN.finditer(code):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)!r}")
    assert not hits, "architecture names in exporter/tagging code:\n" + "\n".join(hits)
