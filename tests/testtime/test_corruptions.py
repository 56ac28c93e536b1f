"""Corruptions: every registered one is seeded, stays in [0, 1] and grows with the severity."""

from __future__ import annotations

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime.corruptions import CORRUPTIONS, SEVERITIES, corrupt, gaussian_blur


@pytest.mark.must
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_is_bounded_seeded_and_monotonic(name: str, digits) -> None:
    x = digits.x_test[:64]
    assert name in SEVERITIES
    dist = []
    for severity in range(1, 6):
        y = corrupt(x, name, severity, seed=3)
        assert y.shape == x.shape and y.dtype == np.float32 and 0.0 <= y.min() and y.max() <= 1.0
        np.testing.assert_array_equal(y, corrupt(x, name, severity, seed=3))
        dist.append(float(np.abs(y - x).mean()))
    assert all(a < b for a, b in zip(dist, dist[1:], strict=False)), dist


@pytest.mark.sanity
def test_blur_keeps_constant_images_and_mass() -> None:
    flat = np.full((1, 1, 8, 8), 0.5, np.float32)
    np.testing.assert_allclose(gaussian_blur(flat, 1.0), flat, rtol=1e-6)
    spike = np.zeros((1, 1, 9, 9), np.float32)
    spike[..., 4, 4] = 1.0
    blurred = gaussian_blur(spike, 0.8)
    assert blurred[..., 4, 4] < 1.0 and abs(float(blurred.sum()) - 1.0) < 1e-5


@pytest.mark.sanity
def test_bad_corruption_arguments() -> None:
    x = np.zeros((1, 1, 8, 8), np.float32)
    with pytest.raises(TestTimeError, match="valid: gaussian_noise, contrast, blur"):
        corrupt(x, "snow", 1)
    with pytest.raises(TestTimeError, match="severity must be 1..5"):
        corrupt(x, "blur", 6)
