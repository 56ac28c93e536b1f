"""Aggregators on hand-made inputs; every registered aggregator must have an expected value here."""

from __future__ import annotations

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime.aggregate import AGGREGATORS, aggregate, entropy, softmax

# Two views, one example, three classes, given as log-probabilities so softmax returns them exactly.
P1 = np.array([0.7, 0.2, 0.1])
P2 = np.array([0.1, 0.5, 0.4])
LOGITS = np.log(np.stack([P1, P2]))[:, None, :]  # (K=2, N=1, C=3)


def _norm(v: np.ndarray) -> np.ndarray:
    return v / v.sum()


EXPECTED = {
    "mean": (P1 + P2) / 2,
    "mean_logits": _norm(np.sqrt(P1 * P2)),  # softmax of the mean log-probability
    "geometric_mean": _norm(np.sqrt(P1 * P2)),
    "max": _norm(np.maximum(P1, P2)),
    "median": _norm((P1 + P2) / 2),  # median of two values is their mean
    "vote": None,  # checked below: one vote each for classes 0 and 1
    "tsharpen": _norm((np.sqrt(P1) + np.sqrt(P2)) / 2),
}


@pytest.mark.must
def test_every_aggregator_has_an_expected_value() -> None:
    assert set(AGGREGATORS) == set(EXPECTED)


@pytest.mark.must
@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_aggregator_on_hand_made_input(name: str) -> None:
    out = aggregate(LOGITS, name)
    assert out.shape == (1, 3)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
    if EXPECTED[name] is not None:
        np.testing.assert_allclose(out[0], EXPECTED[name], rtol=1e-5)


@pytest.mark.sanity
def test_vote_counts_views_and_breaks_ties_by_mean_probability() -> None:
    out = aggregate(LOGITS, "vote")[0]
    np.testing.assert_allclose(out, [0.5, 0.5, 0.0], atol=1e-5)
    assert out.argmax() == 0  # tie: class 0 has the higher mean probability (0.4 vs 0.35)
    three = np.log(np.stack([P1, P2, P2]))[:, None, :]
    assert aggregate(three, "vote")[0].argmax() == 1


@pytest.mark.sanity
@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_class_axis_for_dense_outputs(name: str) -> None:
    dense = np.random.default_rng(0).standard_normal((3, 2, 4, 5, 5))  # (K, N, C, H, W)
    out = aggregate(dense, name, class_axis=1)
    assert out.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    moved = aggregate(np.moveaxis(dense, 2, -1), name)
    np.testing.assert_allclose(np.moveaxis(out, 1, -1), moved, rtol=1e-5, atol=1e-7)


@pytest.mark.sanity
def test_softmax_and_entropy() -> None:
    np.testing.assert_allclose(softmax(np.zeros((1, 4))), 0.25)
    np.testing.assert_allclose(entropy(np.full((1, 4), 0.25)), np.log(4))


@pytest.mark.must
def test_unknown_aggregator_lists_the_valid_ones() -> None:
    with pytest.raises(TestTimeError, match="valid: mean, mean_logits"):
        aggregate(LOGITS, "average")
