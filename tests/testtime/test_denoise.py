"""Input denoising before adaptation (testtime/denoise.py): the noise estimate, the filter, and the engine using
them only for a model that records its source's noise (issue 25)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.metadata import read_metadata, write_metadata
from modelexport.metadata.schema import KEY_INPUT_NOISE
from modelexport.testtime import (
    InputNoise,
    TestTimeEngine,
    TestTimePolicy,
    calibrate_restoration,
    denoise,
    noise_ratio,
    restore,
    sharpen,
    sharpness,
)
from modelexport.testtime.corruptions import corrupt, gaussian_blur
from modelexport.testtime.denoise import BLUR_SIGMA, SHARPEN_STRENGTHS, restore_measured
from modelexport.testtime.memory import BLUR_GATE, StatisticsMemory
from modelexport.testtime.streams import Stream


def _step_image(sigma: float, seed: int = 0) -> tuple[np.ndarray, float]:
    """A 32x32 step edge (0 | 1) plus Gaussian noise of ``sigma``, and the true noise-over-spread ratio."""
    rng = np.random.default_rng(seed)
    x = np.zeros((1, 1, 32, 32), np.float32)
    x[..., 16:] = 1.0
    noisy = x + rng.normal(0.0, sigma, x.shape).astype(np.float32)
    return noisy, sigma / float(noisy.std())


@pytest.mark.smoke
@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.3])
def test_the_noise_ratio_reads_gaussian_noise_beside_an_edge(sigma: float) -> None:
    x, truth = _step_image(sigma)
    assert noise_ratio(x)[0, 0] == pytest.approx(truth, rel=0.15)


@pytest.mark.smoke
def test_the_noise_ratio_is_blind_to_normalisation_and_contrast_and_zero_on_flat_images() -> None:
    x, _ = _step_image(0.1)
    np.testing.assert_allclose(noise_ratio(3.0 * x - 0.5), noise_ratio(x), rtol=1e-4)
    clean, _ = _step_image(0.0)
    assert noise_ratio(clean)[0, 0] == 0.0
    assert noise_ratio(np.ones((2, 3, 8, 8), np.float32)).tolist() == [[0.0] * 3] * 2  # constant: no spread


@pytest.mark.smoke
def test_denoise_moves_each_example_by_its_own_noise() -> None:
    clean, _ = _step_image(0.0)
    noisy, _ = _step_image(0.3, seed=1)
    x = np.concatenate([clean, noisy])
    assert denoise(clean, 0.0, 3.0) is clean  # nothing above the floor: the batch as given
    out = denoise(x, 0.0, 100.0)  # all the way for the noisy example, untouched the clean one
    np.testing.assert_array_equal(out[0], clean[0])
    np.testing.assert_allclose(out[1], gaussian_blur(noisy, BLUR_SIGMA)[0], rtol=1e-5, atol=1e-6)
    assert denoise(x, float(noise_ratio(noisy)[0, 0]), 100.0) is x  # the floor at its level: no move
    np.testing.assert_array_equal(denoise(x, 0.0, 0.0), x)


@pytest.mark.smoke
def test_restoration_reports_each_examples_noise_above_the_floor() -> None:
    """What the denoising takes out, read before it: each example's squared noise ratio above the floor's
    square (0 below it), averaged over its channels; none where the record denoises nothing."""
    clean, _ = _step_image(0.0)
    noisy, _ = _step_image(0.3, seed=1)
    x = np.concatenate([clean, noisy])
    ratio = float(noise_ratio(noisy)[0, 0])
    out, excess, deficit = restore_measured(x, InputNoise(0.5 * ratio, 2.0, 0))
    np.testing.assert_array_equal(out, restore(x, InputNoise(0.5 * ratio, 2.0, 0)))
    np.testing.assert_allclose(excess, [0.0, 0.75 * ratio**2], rtol=1e-6)
    assert deficit is None  # denoising only
    assert restore_measured(x, InputNoise(0.0, 0.0, 0, 0.9, 1.0))[1] is None  # sharpening only


@pytest.mark.smoke
def test_restoration_reports_each_examples_missing_detail() -> None:
    """What the sharpening gives back, read before it: the share of the floor's squared detail an example
    lacks, 0 for one as sharp as the floor or sharper; none where the record sharpens nothing."""
    clean, _ = _step_image(0.0)
    textured = (clean + 0.3 * np.random.default_rng(2).random(clean.shape)).astype(np.float32)
    x = np.concatenate([textured, gaussian_blur(textured, 1.0)])
    floor = float(sharpness(textured)[0, 0])
    record = InputNoise(0.0, 0.0, 0, floor, 1.0)
    out, excess, deficit = restore_measured(x, record)
    np.testing.assert_array_equal(out, restore(x, record))
    assert excess is None
    blurred = float(sharpness(x[1:])[0, 0])
    np.testing.assert_allclose(deficit, [0.0, 1.0 - (blurred / floor) ** 2], rtol=1e-5, atol=1e-7)
    assert 0.5 < deficit[1] < 1.0  # this blur takes most of the finest detail
    assert restore_measured(x, InputNoise(0.1, 2.0, 0))[2] is None


@pytest.mark.smoke
def test_a_streams_sharpening_opens_with_its_mean_detail_deficit() -> None:
    """A batch gets the share of the sharpening its stream's mean detail deficit opens: none up to
    ``memory.BLUR_GATE`` (a mild blur, which sharpened example by example scattered streams around plain), all
    of it from twice that, the memory's entries counting with the batch's examples; the readings are the
    examples' own either way."""
    clean, _ = _step_image(0.0)
    textured = (clean + 0.3 * np.random.default_rng(2).random(clean.shape)).astype(np.float32)
    x = gaussian_blur(textured, 0.5)  # a gain of 1.4, under MAX_SHARPEN at every strength
    record = InputNoise(0.0, 0.0, 0, float(sharpness(textured)[0, 0]), 1.0)
    full, _, deficit = restore_measured(x, record)
    shut, _, read = restore_measured(x, record, lambda d: 0.0)
    np.testing.assert_array_equal(shut, x)
    np.testing.assert_array_equal(read, deficit)
    half = restore_measured(x, record, lambda d: 0.5)[0]  # the strength scaled
    np.testing.assert_array_equal(half, restore(x, InputNoise(0.0, 0.0, 0, record.sharp_floor, 0.5)))
    assert not np.array_equal(half, full)
    np.testing.assert_array_equal(restore_measured(x, record, lambda d: 1.0)[0], full)

    fresh = TestTimeEngine._sharpening(Stream())  # no memory: the batch alone
    assert fresh(np.full(4, BLUR_GATE)) == 0.0 and fresh(np.full(4, 2 * BLUR_GATE)) == 1.0
    assert fresh(np.full(4, 1.5 * BLUR_GATE)) == pytest.approx(0.5)
    stream = Stream()
    stream.bank = StatisticsMemory(128, 2, 10)
    stream.bank.add(np.zeros((4, 2)), np.arange(4), None, np.zeros(4))  # four entries lacking nothing
    assert TestTimeEngine._sharpening(stream)(np.full(4, 3 * BLUR_GATE)) == pytest.approx(0.5)


@pytest.mark.smoke
def test_sharpness_reads_a_blur_and_sharpening_gives_detail_back() -> None:
    clean, _ = _step_image(0.0)
    rng = np.random.default_rng(2)
    textured = (clean + 0.3 * rng.random(clean.shape)).astype(np.float32)  # detail everywhere
    blurred = gaussian_blur(textured, 1.0)
    assert sharpness(blurred)[0, 0] < 0.5 * sharpness(textured)[0, 0]
    floor = float(sharpness(textured)[0, 0])
    assert sharpen(textured, floor, 1.0) is textured  # as sharp as the source: the batch as given
    restored = sharpen(blurred, floor, 1.0)
    assert sharpness(blurred)[0, 0] < sharpness(restored)[0, 0] <= floor
    np.testing.assert_array_equal(sharpen(blurred, floor, 0.0), blurred)


@pytest.mark.must
def test_the_strength_is_checked() -> None:
    with pytest.raises(TestTimeError, match="denoise"):
        TestTimePolicy(ttt="bn", denoise=-1.0)
    with pytest.raises(TestTimeError, match="denoise"):
        TestTimePolicy(ttt="bn", denoise=float("nan"))
    with pytest.raises(TestTimeError, match="sharpen"):
        TestTimePolicy(ttt="bn", sharpen=-0.5)


def _recorded(export: Any, data: Any, folder: Path) -> tuple[Path, InputNoise]:
    """``export``'s model with its source's noise record, calibrated as the image pipeline does it (held-out
    images: the first 256 test images; the streams below run on the others)."""
    path = folder / "model.onnx"
    shutil.copy(export.onnx_path, path)
    record = calibrate_restoration(path, data.x_train, data.x_test[:HELD], data.y_test[:HELD])
    write_metadata(path, {KEY_INPUT_NOISE: record.to_dict()})
    return path, record


def _accuracy(path: Path, policy: TestTimePolicy, x: np.ndarray, y: np.ndarray, batch: int = 64) -> float:
    engine = TestTimeEngine(path, policy)
    stream = engine.new_stream()
    preds = np.concatenate(
        [
            engine.predict({engine.input_name: x[i : i + batch]}, stream).argmax(1)
            for i in range(0, len(x), batch)
        ]
    )
    return float((preds == y).mean())


HELD = 256


@pytest.mark.must
def test_calibration_turns_denoising_on_where_it_helps(
    shapes: Any, shapes_export: Any, tmp_path: Path
) -> None:
    """The drawn shapes' CNN: calibration picks a strength, and with it ``--ttt bn`` on Gaussian noise 4 recovers
    far more than without (measured: 0.66 -> 0.95 on the stream's 744 images, plain 0.11); clean shapes lose
    nothing; the plain policy is untouched."""
    path, record = _recorded(shapes_export, shapes, tmp_path)
    assert record.floor == 0.0 and record.strength > 0 and record.examples == len(shapes.x_train)
    assert InputNoise.from_dict(read_metadata(path)[KEY_INPUT_NOISE]) == record
    x, y = shapes.x_test[HELD:], shapes.y_test[HELD:]
    noisy = corrupt(x, "gaussian_noise", 4, seed=0)
    on, off = TestTimePolicy(ttt="bn"), TestTimePolicy(ttt="bn", denoise=0.0)
    assert _accuracy(path, on, noisy, y) >= _accuracy(path, off, noisy, y) + 0.1
    assert _accuracy(path, on, x, y) >= _accuracy(path, off, x, y) - 0.005
    batch = {"pixel_values": noisy[:32]}
    plain = TestTimeEngine(path, TestTimePolicy()).predict(batch)
    np.testing.assert_array_equal(
        plain, TestTimeEngine(shapes_export.onnx_path, TestTimePolicy()).predict(batch)
    )


@pytest.mark.must
def test_calibration_turns_denoising_off_where_it_hurts_and_sharpening_on(
    digits: Any, digits_export: Any, tmp_path: Path
) -> None:
    """The digits CNN, trained on crisp digits: a blur costs it more than the noise it removes (a forced strength
    of 3 measured 0.77 against 0.84 on noisy digits, 0.97 against 1.0 on clean ones), so calibration records
    strength 0 and noisy batches run as without the record; sharpening gives blurred digits their detail back
    (blur 4: 0.77 -> 0.82 on the 194 streamed digits); a model without the record is not denoised whatever the
    policy says."""
    path, record = _recorded(digits_export, digits, tmp_path)
    assert record.strength == 0.0 and record.sharpen in SHARPEN_STRENGTHS and record.sharpen > 0
    x, y = digits.x_test[HELD:], digits.y_test[HELD:]
    noisy = corrupt(x, "gaussian_noise", 4, seed=0)
    forced, off = TestTimePolicy(ttt="bn", denoise=3.0), TestTimePolicy(ttt="bn", denoise=0.0)
    assert _accuracy(path, forced, noisy, y) <= _accuracy(path, off, noisy, y) - 0.02
    batch = {"x": noisy[:32]}
    recorded = TestTimeEngine(path, TestTimePolicy(ttt="bn")).predict(batch)
    np.testing.assert_array_equal(recorded, TestTimeEngine(path, off).predict(batch))
    unrecorded = TestTimeEngine(digits_export.onnx_path, forced).predict(batch)
    np.testing.assert_array_equal(unrecorded, TestTimeEngine(digits_export.onnx_path, off).predict(batch))
    blurred = corrupt(x, "blur", 4, seed=0)
    unsharp = TestTimePolicy(ttt="bn", sharpen=0.0)
    with_sharpening = _accuracy(path, TestTimePolicy(ttt="bn"), blurred, y)
    assert with_sharpening >= _accuracy(path, unsharp, blurred, y) + 0.03


@pytest.mark.must
@pytest.mark.parametrize(
    "record", [{"floor": "low", "strength": 3.0}, {"floor": 0.1}, {"floor": -1, "strength": 2}]
)
def test_a_malformed_record_is_refused_with_a_way_around(
    digits_export: Any, tmp_path: Path, record: dict[str, Any]
) -> None:
    path = tmp_path / "model.onnx"
    shutil.copy(digits_export.onnx_path, path)
    write_metadata(path, {KEY_INPUT_NOISE: record})
    with pytest.raises(TestTimeError, match="input_noise record") as info:
        TestTimeEngine(path, TestTimePolicy(ttt="bn"))
    assert "--denoise 0 --sharpen 0" in str(info.value.hint)
    TestTimeEngine(path, TestTimePolicy(ttt="bn", denoise=0.0, sharpen=0.0))  # off: the record is not read
