"""The image classifier's training-time augmentation: label-preserving warps, on training batches only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from modelexport.data import load_dataset
from modelexport.errors import ConfigError
from modelexport.train.cnn import AFFINE_PRESETS, AffineJitter
from modelexport.train.networks import build_network
from modelexport.train.program import ClassifierProgram, label_accuracy, to_examples
from modelexport.train.weights import TorchWeightOptimizer, TrainConfig, evaluate_program


def _accuracy(model: Any, x: torch.Tensor, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1).numpy() == y).mean())


@pytest.mark.sanity
def test_light_jitter_keeps_shapes_and_labels(digits_cnn: Any, digits_data: Any) -> None:
    """A CNN that never saw augmentation still reads most jittered digits (about 0.80 of them, against 0.98
    clean: the jitter is real but keeps the digit), far more than mirrored ones (about 0.37: why the
    augmentation never flips digits)."""
    x, y = torch.from_numpy(digits_data.x_test), digits_data.y_test
    jitter = AFFINE_PRESETS["light"]
    warped = jitter(x, torch.Generator().manual_seed(0))
    assert warped.shape == x.shape and warped.dtype == x.dtype
    assert (warped - x).abs().mean() > 0.02  # it does change the images
    assert torch.equal(warped, jitter(x, torch.Generator().manual_seed(0)))  # seeded
    clean, jittered, mirrored = (_accuracy(digits_cnn, v, y) for v in (x, warped, x.flip(-1)))
    assert 0.7 <= jittered < clean and jittered > mirrored + 0.3, (clean, jittered, mirrored)
    assert AFFINE_PRESETS["none"](x, torch.Generator()) is x


@pytest.mark.must
@pytest.mark.parametrize("field", ["rotation_deg", "scale", "shift", "probability"])
def test_jitter_rejects_out_of_range(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        AffineJitter(**{field: 50.0})


@pytest.mark.sanity
@pytest.mark.parametrize("augment", [True, False])
def test_augmentation_runs_on_training_batches_only(augment: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer augments each training batch (when asked); prediction and validation never do."""
    train, val = load_dataset("sklearn:digits").subset(range(160)).split(0.25, seed=0)
    network = build_network("image_classifier", train)
    seen: list[tuple[int, ...]] = []
    real = network.augment

    def counted(feeds: dict[str, np.ndarray], generator: Any) -> dict[str, np.ndarray]:
        out = real(feeds, generator)
        assert out.keys() == feeds.keys() and out["pixel_values"].dtype == np.float32
        seen.append(out["pixel_values"].shape)
        return out

    monkeypatch.setattr(network, "augment", counted)
    program = ClassifierProgram(network)
    config = TrainConfig(epochs=2, batch_size=32, max_steps_per_epoch=2, augment=augment, progress=False)
    TorchWeightOptimizer(config).compile(program, trainset=to_examples(train), valset=to_examples(val))
    assert seen == ([(32, 1, 8, 8)] * 4 if augment else [])
    first = program.probabilities(val.images)
    program.accuracy(val)
    evaluate_program(program, to_examples(val), label_accuracy)
    assert len(seen) == (4 if augment else 0)
    np.testing.assert_array_equal(first, program.probabilities(val.images))  # deterministic: no jitter
