"""Ensembles of ONNX models: mean of member probabilities, votes, and input checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime import Ensemble, TestTimeEngine
from modelexport.testtime.graph import initializer_arrays, write_initializers


@pytest.fixture(scope="module")
def members(mlp_export: Any) -> list[onnx.ModelProto]:
    """Three MLPs: the export and two copies with perturbed weights (distinct members, same inputs)."""
    base = onnx.load(mlp_export.onnx_path)
    out = [base]
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        arrays = initializer_arrays(base)
        out.append(
            write_initializers(
                base, {k: v + 0.3 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in arrays.items()}
            )
        )
    return out


@pytest.mark.must
def test_mean_ensemble_is_the_mean_of_member_probabilities(members: list[onnx.ModelProto]) -> None:
    x = {"input": np.random.default_rng(0).standard_normal((10, 6)).astype(np.float32)}
    ens = Ensemble(members, "mean")
    expected = np.mean([TestTimeEngine(m).predict(x) for m in members], axis=0)
    np.testing.assert_allclose(ens.predict(x), expected, rtol=1e-5)


@pytest.mark.sanity
def test_vote_ensemble_follows_the_majority(members: list[onnx.ModelProto]) -> None:
    x = {"input": np.random.default_rng(1).standard_normal((50, 6)).astype(np.float32)}
    per_member = Ensemble(members).member_probs(x).argmax(-1)  # (3, 50)
    voted = Ensemble(members, "vote").predict(x).argmax(-1)
    majority = [np.bincount(col, minlength=3).max() >= 2 for col in per_member.T]
    for i in np.flatnonzero(majority):
        assert voted[i] == np.bincount(per_member[:, i], minlength=3).argmax()


@pytest.mark.sanity
def test_ensemble_needs_two_models(members: list[onnx.ModelProto]) -> None:
    with pytest.raises(TestTimeError, match="at least two"):
        Ensemble(members[:1])
    with pytest.raises(TestTimeError, match="valid: mean"):
        Ensemble(members, "average")
