"""MC dropout: the rewritten graph samples (variance > 0), is reproducible per seed, and errors clearly."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime import TestTimeEngine, TestTimePolicy, enable_mc_dropout, mc_summary


@pytest.mark.regression
def test_exported_dropout_alone_is_removed_by_onnx_runtime(digits_export: Any, digits: Any) -> None:
    """Why the rewrite exists: ORT's optimizer drops training-mode Dropout, so the plain export is deterministic."""
    sess = ort.InferenceSession(str(digits_export.onnx_path))
    x = digits.x_test[:16]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])
    assert "Dropout" in {n.op_type for n in onnx.load(digits_export.onnx_path).graph.node}


@pytest.mark.must
def test_mc_dropout_variance_is_positive_and_seeded(digits_export: Any, digits: Any) -> None:
    x = {"x": digits.x_test[:32]}
    run = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(mc_dropout=16, seed=1)).run(x)
    again = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(mc_dropout=16, seed=1)).run(x)
    other = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(mc_dropout=16, seed=2)).run(x)
    assert run.uncertainty is not None and float(run.uncertainty.variance.max()) > 0
    np.testing.assert_array_equal(run.probs, again.probs)
    np.testing.assert_array_equal(run.uncertainty.variance, again.uncertainty.variance)
    assert not np.array_equal(run.probs, other.probs)
    plain = TestTimeEngine(digits_export.onnx_path).predict(x)
    assert (run.probs.argmax(1) == plain.argmax(1)).mean() > 0.9  # the mean prediction stays close


@pytest.mark.sanity
def test_rewrite_keeps_the_expected_value(digits_export: Any, digits: Any) -> None:
    """Inverted dropout: averaged over many masks, the pre-dropout features are recovered (scale 1/(1-p))."""
    model = enable_mc_dropout(digits_export.onnx_path, seed=0)
    assert "Dropout" not in {n.op_type for n in model.graph.node}
    x = np.repeat(digits.x_test[:1], 4000, axis=0)
    logits = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    plain = ort.InferenceSession(str(digits_export.onnx_path)).run(None, {"x": x[:1]})[0]
    np.testing.assert_allclose(logits.mean(axis=0), plain[0], atol=0.15 * np.abs(plain).max())


@pytest.mark.sanity
def test_mc_summary_on_hand_made_passes() -> None:
    same = np.log(np.array([[[0.5, 0.5]], [[0.5, 0.5]]]))
    s = mc_summary(same)
    np.testing.assert_allclose(s.variance, 0.0, atol=1e-7)
    np.testing.assert_allclose(s.entropy, np.log(2), rtol=1e-5)
    np.testing.assert_allclose(s.mutual_information, 0.0, atol=1e-6)
    disagree = mc_summary(np.log(np.array([[[0.9, 0.1]], [[0.1, 0.9]]])))
    assert disagree.mutual_information[0] > 0.3 and disagree.variance[0, 0] > 0.1


@pytest.mark.must
def test_model_without_dropout_is_refused(mlp_export: Any) -> None:
    with pytest.raises(TestTimeError, match="no Dropout nodes") as info:
        TestTimeEngine(mlp_export.onnx_path, TestTimePolicy(mc_dropout=4))
    assert "keep_dropout" in info.value.hint
