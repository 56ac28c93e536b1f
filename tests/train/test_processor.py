"""Training pre-processes images with the processor the package embeds: what ``infer`` builds from the
exported model gives the tensor the network was trained on, for any image it is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.inference.processors import ONNXAutoProcessor


@pytest.mark.sanity
def test_training_tensor_equals_the_inference_processors(
    deployed_digits: tuple[Any, Path], digits_splits: Any, tmp_path: Path
) -> None:
    from PIL import Image

    program, onnx_path = deployed_digits
    _, _, test = digits_splits
    network = program.network
    served = ONNXAutoProcessor.from_model(onnx_path)  # what `infer` on the package pre-processes with
    odd = np.random.default_rng(0).integers(0, 255, (13, 11, 3), dtype=np.uint8)  # RGB, another size
    Image.fromarray(odd).save(tmp_path / "odd.png")
    inputs = [*test.images[:16], odd, str(tmp_path / "odd.png")]
    trained = network.encode(inputs)["pixel_values"]
    np.testing.assert_array_equal(trained, served(images=inputs)["pixel_values"])
    assert trained.shape == (18, network.channels, *network.image_size) and trained.dtype == np.float32
    # the training-size images get the normalisation measured on the training set, as before
    x = np.stack(test.images[:16]).astype(np.float32) / 255.0
    want = ((x - np.float32(network.mean)) / np.float32(network.std)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(trained[:16], want, rtol=0, atol=1e-5)
