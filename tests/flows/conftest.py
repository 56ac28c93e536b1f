"""Cross-area flows reuse the session's tiny task exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.inference.conftest import task_export, task_source  # noqa: F401 - session fixtures


def write_image_folder(root: Path, count: int = 20) -> Path:
    """``count`` random 8 x 8 grayscale PNGs in two class folders (what the pipeline's CNN trains on in seconds)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / ("even" if i % 2 == 0 else "odd")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), mode="L").save(folder / f"{i:03d}.png")
    return root
