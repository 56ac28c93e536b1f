"""Session fixtures: the shared digits CNN's export (the CNN is trained once in tests/conftest.py), and tiny
models exported once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.testtime.digits import DigitsData


@pytest.fixture(scope="session")
def digits(digits_data: DigitsData) -> DigitsData:
    """The test-time tests' name for the shared digits split."""
    return digits_data


@pytest.fixture(scope="session")
def digits_export(export_cache: Any, digits_cnn: Any) -> Any:
    """The trained digits CNN keeping BatchNorm and (train-mode) Dropout: BN adaptation, Tent and MC dropout."""
    return export_cache.get(
        "digits_cnn", digits_cnn, keep_batchnorm=True, keep_dropout=True, input_shape=(1, 1, 8, 8)
    )


@pytest.fixture(scope="session")
def shapes() -> Any:
    """The drawn-shapes dataset (tests/testtime/shapes.py): 3000 training, 1000 held-out images."""
    from tests.testtime.shapes import load_shapes_data

    return load_shapes_data()


@pytest.fixture(scope="session")
def shapes_export(export_cache: Any, shapes: Any) -> Any:
    """The image pipeline's CompactCNN trained on the shapes (about 10 s), exported keeping BatchNorm."""
    from tests.testtime.shapes import train_shapes_cnn

    return export_cache.get(
        "shapes_cnn", lambda: train_shapes_cnn(shapes), keep_batchnorm=True, input_shape=(1, 1, 16, 16)
    )


@pytest.fixture(scope="session")
def mlp_export(export_cache: Any) -> Any:
    import torch

    from tests.models.torch_models import mlp

    def make() -> Any:
        torch.manual_seed(0)
        return mlp()

    return export_cache.get("tt_mlp", make)


@pytest.fixture(scope="session")
def segmenter_export(export_cache: Any) -> Any:
    import torch

    from tests.testtime.models import PixelSegmenter

    def make() -> Any:
        torch.manual_seed(0)
        return PixelSegmenter()

    return export_cache.get("tt_segmenter", make, input_shape=(2, 3, 6, 6))


@pytest.fixture(scope="session")
def refiner_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch

    from tests.testtime.models import Refiner

    def make() -> Any:
        torch.manual_seed(0)
        return Refiner()

    import modelexport

    # "dynamic_axes": {} keeps every axis fixed (a spec without it gets a dynamic batch axis)
    specs = {
        "inputs": [
            {"name": "state", "shape": [3, 6], "dynamic_axes": {}},
            {"name": "context", "shape": [3, 6], "dynamic_axes": {}},
        ]
    }
    return modelexport.export(make(), tmp_path_factory.mktemp("refiner"), input_specs=specs)


@pytest.fixture()
def digits_batch(digits: DigitsData) -> dict[str, np.ndarray]:
    return {"x": digits.x_test[:64]}
