"""Real data for calibration and evaluation: a registry of readers keyed by what the path holds.

Each reader turns a path into :class:`SampleSet` feeds that match the ONNX model's inputs (names,
dtypes, static dims): text files go through the model's own tokenizer, image folders through its
image processor (or the processor settings embedded in the metadata), ``.npz`` files are used as
they are. Samples are batch-1 feeds, so they fit static and dynamic batch dims alike.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DatasetError
from .carry import model_metadata, read_sidecar

__all__ = [
    "SampleSet",
    "InputInfo",
    "READERS",
    "register_reader",
    "load_samples",
    "model_inputs",
    "find_model_dir",
]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}
TEXT_COLUMNS = ("text", "sentence", "sentence1", "content", "review")


@dataclass(frozen=True)
class InputInfo:
    name: str
    dtype: Any  # numpy dtype
    shape: tuple[int | None, ...]


@dataclass
class SampleSet:
    """Batch-1 feeds (input name -> array) and, when the data has them, integer labels."""

    feeds: list[dict[str, Any]]
    labels: list[int] | None = None
    kind: str = ""
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.feeds)


@dataclass(frozen=True)
class ReadContext:
    inputs: tuple[InputInfo, ...]
    onnx_path: Path | None
    metadata: dict[str, Any]
    limit: int
    seed: int = 0
    tokenizer: str | None = None


Reader = Callable[[Path, ReadContext], SampleSet]
#: name -> (does this path hold my kind of data?, reader)
READERS: dict[str, tuple[Callable[[Path], bool], Reader]] = {}


def register_reader(name: str, matches: Callable[[Path], bool]) -> Callable[[Reader], Reader]:
    def deco(fn: Reader) -> Reader:
        READERS[name] = (matches, fn)
        return fn

    return deco


def model_inputs(model: Any) -> tuple[InputInfo, ...]:
    """Graph inputs that are not initializers, with numpy dtypes and static dims (None if dynamic)."""
    import onnx

    init = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        out.append(InputInfo(vi.name, dtype, shape))
    return tuple(out)


def find_model_dir(onnx_path: Path | None, explicit: str | None = None) -> Path | None:
    """Where the tokenizer / processor lives: explicit, beside the ONNX file, or the exported source folder."""
    if explicit:
        path = Path(explicit)
        if not path.is_dir():
            raise ConfigError(f"tokenizer/processor folder not found: {path}")
        return path
    if onnx_path is None:
        return None
    here = onnx_path.parent
    markers = ("tokenizer_config.json", "tokenizer.json", "preprocessor_config.json", "vocab.txt")
    if any((here / m).is_file() for m in markers):
        return here
    source = ((read_sidecar(onnx_path) or {}).get("model") or {}).get("name_or_path")
    if source and Path(str(source)).is_dir():
        return Path(str(source))
    return None


def _subsample(items: list[Any], ctx: ReadContext) -> list[Any]:
    if len(items) <= ctx.limit:
        return items
    rng = random.Random(ctx.seed)
    return [items[i] for i in sorted(rng.sample(range(len(items)), ctx.limit))]


# -- text -----------------------------------------------------------------------------------------


def _read_text_rows(path: Path) -> list[tuple[str, int | None]]:
    try:
        if path.suffix.lower() in (".csv", ".tsv"):
            with path.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
        elif path.suffix.lower() == ".jsonl":
            rows = [
                json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
            ]
        else:
            rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    if isinstance(rows, dict):
        rows = rows.get("data") or rows.get("texts") or []
    out: list[tuple[str, int | None]] = []
    for row in rows:
        if isinstance(row, str):
            out.append((row, None))
            continue
        col = next((c for c in TEXT_COLUMNS if c in row), None)
        if col is None:
            raise DatasetError(
                f"{path}: no text column; expected one of {', '.join(TEXT_COLUMNS)}, got {', '.join(row)}"
            )
        label = row.get("label")
        out.append((str(row[col]), int(label) if label not in (None, "") else None))
    if not out:
        raise DatasetError(f"{path} holds no samples")
    return out


def _tokenizer(ctx: ReadContext) -> Any:
    model_dir = find_model_dir(ctx.onnx_path, ctx.tokenizer)
    if model_dir is None:
        raise ConfigError(
            "text calibration data needs the model's tokenizer: none beside the ONNX file or in the exported source",
            hint="pass --tokenizer MODEL_DIR (the Hugging Face folder the model was exported from)",
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {model_dir}: {exc}") from exc


@register_reader("text", lambda p: p.is_file() and p.suffix.lower() in (".csv", ".tsv", ".json", ".jsonl"))
def read_text(path: Path, ctx: ReadContext) -> SampleSet:
    """CSV/TSV (``text``/``sentence`` + optional ``label`` column), JSON list, or JSONL."""
    rows = _subsample(_read_text_rows(path), ctx)
    tok = _tokenizer(ctx)
    seq = next((i.shape[1] for i in ctx.inputs if len(i.shape) == 2 and i.shape[1]), None)
    pad = {"padding": "max_length", "max_length": seq} if seq else {"max_length": 128}
    feeds = []
    for text, _ in rows:
        enc = tok(text, return_tensors="np", truncation=True, **pad)
        feeds.append(_match_inputs(dict(enc), ctx.inputs, path))
    labels = [r[1] for r in rows]
    return SampleSet(feeds, labels if all(lb is not None for lb in labels) else None, "text")


def _match_inputs(arrays: dict[str, Any], inputs: tuple[InputInfo, ...], path: Path) -> dict[str, Any]:
    import numpy as np

    feed = {}
    for info in inputs:
        if info.name in arrays:
            feed[info.name] = np.asarray(arrays[info.name]).astype(info.dtype)
        elif info.name == "token_type_ids" and "input_ids" in arrays:
            feed[info.name] = np.zeros_like(arrays["input_ids"], dtype=info.dtype)
        else:
            raise DatasetError(f"{path}: no data for model input {info.name!r}; have {', '.join(arrays)}")
    return feed


# -- npz ------------------------------------------------------------------------------------------


@register_reader("npz", lambda p: p.is_file() and p.suffix.lower() == ".npz")
def read_npz(path: Path, ctx: ReadContext) -> SampleSet:
    """Arrays named like the model's inputs, samples on axis 0; optional ``labels``."""
    import numpy as np

    try:
        data = dict(np.load(path))
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    names = [i.name for i in ctx.inputs]
    if len(names) == 1 and names[0] not in data:
        arrays = [k for k in data if k != "labels"]
        if len(arrays) == 1:
            data[names[0]] = data.pop(arrays[0])
    n = min((len(data[k]) for k in names if k in data), default=0)
    index = _subsample(list(range(n)), ctx)
    feeds = [_match_inputs({k: v[i : i + 1] for k, v in data.items()}, ctx.inputs, path) for i in index]
    if not feeds:
        raise DatasetError(f"{path} holds no samples for inputs {', '.join(names)}")
    labels = [int(data["labels"][i]) for i in index] if "labels" in data else None
    return SampleSet(feeds, labels, "npz")


# -- images ---------------------------------------------------------------------------------------


def _image_files(path: Path) -> list[tuple[Path, int | None]]:
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    if subdirs:  # ImageFolder layout: one folder per class, sorted names -> label ids
        return [
            (f, k)
            for k, d in enumerate(subdirs)
            for f in sorted(d.iterdir())
            if f.suffix.lower() in IMAGE_SUFFIXES
        ]
    return [(f, None) for f in sorted(path.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]


def _config_size(cfg: dict[str, Any]) -> tuple[int, int]:
    """(width, height) from a processor config's ``size`` (int, {height, width} or {shortest_edge}); 224 else."""
    size = cfg.get("size", 224)
    if isinstance(size, dict):
        edge = size.get("shortest_edge", 224)
        return int(size.get("width", edge)), int(size.get("height", edge))
    return int(size), int(size)


def _processor(ctx: ReadContext) -> Callable[[Any], Any]:
    """The model's image processor, else the processor settings embedded in the metadata."""
    import numpy as np

    model_dir = find_model_dir(ctx.onnx_path, ctx.tokenizer)
    if model_dir is not None and (model_dir / "preprocessor_config.json").is_file():
        from transformers import AutoImageProcessor

        proc = AutoImageProcessor.from_pretrained(str(model_dir), local_files_only=True)
        return lambda img: proc(images=img, return_tensors="np")["pixel_values"]
    cfg = ctx.metadata.get("hf_processor_config") or {}
    cfg = json.loads(cfg) if isinstance(cfg, str) else cfg
    shape = ctx.inputs[0].shape
    size = (shape[-1] or _config_size(cfg)[0], shape[-2] or _config_size(cfg)[1])
    mean = np.asarray(cfg.get("image_mean", [0.0]), dtype=np.float32)
    std = np.asarray(cfg.get("image_std", [1.0]), dtype=np.float32)
    gray = (shape[1] if len(shape) == 4 else None) == 1

    def run(img: Any) -> Any:
        arr = np.asarray(img.convert("L" if gray else "RGB").resize(size), dtype=np.float32) * cfg.get(
            "rescale_factor", 1 / 255
        )
        arr = arr[..., None] if arr.ndim == 2 else arr
        return ((arr - mean) / std).transpose(2, 0, 1)[None]

    return run


@register_reader("images", lambda p: p.is_dir())
def read_images(path: Path, ctx: ReadContext) -> SampleSet:
    """A folder of images (or of class folders) through the model's image processor."""
    from PIL import Image

    files = _subsample(_image_files(path), ctx)
    if not files:
        raise DatasetError(f"{path} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    proc = _processor(ctx)
    feeds = []
    for file, _ in files:
        with Image.open(file) as img:
            feeds.append(_match_inputs({ctx.inputs[0].name: proc(img)}, ctx.inputs[:1], path))
    labels = [lb for _, lb in files]
    return SampleSet(feeds, labels if all(lb is not None for lb in labels) else None, "images")


def load_samples(
    source: str | Path,
    model: Any,
    onnx_path: str | Path | None,
    limit: int,
    *,
    tokenizer: str | None = None,
    seed: int = 0,
) -> SampleSet:
    """Read up to ``limit`` batch-1 samples for ``model`` from ``source`` with the matching reader."""
    path = Path(source)
    if not path.exists():
        raise DatasetError(
            f"calibration/eval data not found: {path}",
            hint="check the path given to --calibration-data/--eval-data",
        )
    metadata = model_metadata(model)
    ctx = ReadContext(
        model_inputs(model), Path(onnx_path) if onnx_path else None, metadata, limit, seed, tokenizer
    )
    for name, (matches, reader) in READERS.items():
        if matches(path):
            samples = reader(path, ctx)
            samples.kind = name
            return samples
    raise DatasetError(
        f"unsupported data {path}; give a .csv/.tsv/.json/.jsonl text file, an image folder or a .npz file"
    )
