"""The small exported model every fuzz test mutates: the plain CNN with task, labels and pre-processing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.inference.conftest import cnn_export  # noqa: F401 - the shared session fixture


@pytest.fixture(scope="session")
def fuzz_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("fuzz_img") / "digit.png"
    pixels = (np.random.default_rng(0).random((8, 8)) * 255).astype("uint8")
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope="session")
def fuzz_source(cnn_export: Any) -> Path:  # noqa: F811
    """The intact export folder (read-only: each mutant gets a copy)."""
    return Path(cnn_export.output_dir)
