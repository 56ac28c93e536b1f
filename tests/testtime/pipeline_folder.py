"""The issue's own setting: a model the image pipeline trained on a PNG folder, tested on folders read class by
class (issue 25).

sklearn's digits in file order: the first 1,200 images are written as a PNG folder (one sub-folder per
class) and the pipeline trains on it with its defaults (``--quantize none``: the fp32 model, so the BN
layers are the pipeline's CompactCNN's, width 64); the other 597 (later writers) are the test set. The
drawn shapes (tests/testtime/shapes.py) go the same way: 1,500 training drawings, 1,000 test ones, a
16x16 network one stage deeper. Test images are corrupted in pixel space and stored as PNG (uint8), then
pre-processed by the package's own processor, as ``modelexport evaluate`` would read the folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelexport.testtime.corruptions import corrupt

__all__ = ["FolderModel", "corrupted", "pipeline_model"]

N_TRAIN = {"digits": 1200, "shapes": 1500}


@dataclass(frozen=True)
class FolderModel:
    """The pipeline's package and its test sets, pre-processed (name -> (N, C, H, W) model inputs)."""

    onnx_path: Path
    labels: np.ndarray
    sets: dict[str, np.ndarray]


def _images(dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels); images (N, H, W) in [0, 1]."""
    if dataset == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)
        n = N_TRAIN["digits"]
        return x[:n], y[:n], x[n:], y[n:]
    from tests.testtime.shapes import load_shapes_data

    data = load_shapes_data(N_TRAIN["shapes"], 1000, seed=5)
    return data.x_train[:, 0], data.y_train, data.x_test[:, 0], data.y_test


def _write(root: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    from PIL import Image

    pixels = np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)
    for i, (img, label) in enumerate(zip(pixels, labels, strict=True)):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(root / str(label) / f"{i:05d}.png")
    return root


def _model_inputs(onnx_path: Path, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """The folder through the package's own processor, in the folder's (class by class) order."""
    from modelexport.data import load_dataset
    from modelexport.inference.evaluate import prepare_batches
    from modelexport.inference.processors import ONNXAutoProcessor

    dataset = load_dataset(str(folder))
    sources = ONNXAutoProcessor.sources(onnx_path)
    xs, ys = [], []
    for feeds, labels, *_ in prepare_batches(dataset, sources, 256):
        xs.append(next(iter(feeds.values())))
        ys.append(np.asarray(labels))
    return np.concatenate(xs), np.concatenate(ys)


def corrupted(images: np.ndarray, spec: str) -> np.ndarray:
    """``images`` (N, H, W) under ``spec``: ``clean``, ``NAME@SEVERITY`` or several joined by ``+`` (applied in
    order, e.g. the issue's ``gaussian_noise@2+contrast@2``)."""
    out = images[:, None]
    for k, part in enumerate(p for p in spec.split("+") if p != "clean"):
        name, severity = part.split("@")
        out = corrupt(out, name, int(severity), seed=k)
    return out[:, 0]


def pipeline_model(root: Path, dataset: str, corruptions: tuple[str, ...], seed: int = 0) -> FolderModel:
    """Train (once: ``root`` caches the package) and read the clean and corrupted test folders."""
    train_x, train_y, test_x, test_y = _images(dataset)
    package = root / "package"
    if not (package / "model.onnx").exists():
        from modelexport.workflow.run import run_pipeline

        train_dir = _write(root / "train", train_x, train_y)
        run_pipeline(
            dataset_path=str(train_dir),
            output_model=str(package) + "/",
            quantize="none",
            iterations=1,
            optimize_policy=False,
            progress=False,
            seed=seed,
        )
    onnx_path = package / "model.onnx"
    sets: dict[str, np.ndarray] = {}
    labels = None
    for key in dict.fromkeys(("clean", *corruptions)):
        cache = root / f"{key}.npz"
        if not cache.exists():
            folder = _write(root / "test" / key, corrupted(test_x, key), test_y)
            x, y = _model_inputs(onnx_path, folder)
            np.savez(cache, x=x, y=y)
        stored = np.load(cache)
        sets[key], labels = stored["x"], stored["y"]
    assert labels is not None
    return FolderModel(onnx_path, labels, sets)
