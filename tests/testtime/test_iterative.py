"""Iterative inference: the ONNX Loop model gives the external loop's results, with and without early stop."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.errors import TestTimeError
from modelexport.runtime.session import create_session
from modelexport.testtime import build_loop_model, iterate
from modelexport.testtime.iterative import LOOP_STEPS_OUTPUT

FEEDBACK = {"output": "state"}


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "state": rng.standard_normal((3, 6)).astype(np.float32),
        "context": rng.standard_normal((3, 6)).astype(np.float32),
    }


@pytest.mark.must
@pytest.mark.parametrize(("steps", "tol"), [(1, None), (7, None), (50, 1e-3)])
def test_loop_equals_external_loop(refiner_export: Any, steps: int, tol: float | None) -> None:
    sess, _ = create_session(refiner_export.onnx_path)
    external = iterate(sess, _feeds(), FEEDBACK, steps, tol)
    loop_model = build_loop_model(refiner_export.onnx_path, FEEDBACK, steps, tol)
    assert [n.op_type for n in loop_model.graph.node] == ["Loop", "Size"]
    loop_sess, _ = create_session(loop_model)
    final, n_steps = loop_sess.run(["output", LOOP_STEPS_OUTPUT], _feeds())
    assert int(n_steps) == external.steps
    np.testing.assert_allclose(final, external.outputs["output"], rtol=1e-5, atol=1e-6)
    if tol is not None:
        assert external.steps < steps  # the contraction converged before the step limit


@pytest.mark.sanity
def test_loop_body_keeps_hierarchy_tags(refiner_export: Any) -> None:
    body = build_loop_model(refiner_export.onnx_path, FEEDBACK, 3).graph.node[0].attribute[0].g
    source = onnx.load(refiner_export.onnx_path)
    tags = [
        p.value for n in source.graph.node for p in n.metadata_props if p.key == "modelexport.hierarchy_tag"
    ]
    body_tags = [p.value for n in body.node for p in n.metadata_props if p.key == "modelexport.hierarchy_tag"]
    assert tags and body_tags == tags


@pytest.mark.sanity
def test_bad_feedback_names_are_listed(refiner_export: Any) -> None:
    with pytest.raises(TestTimeError, match="outputs \\['logits'\\]"):
        build_loop_model(refiner_export.onnx_path, {"logits": "state"}, 3)
    with pytest.raises(TestTimeError, match="steps must be >= 1"):
        build_loop_model(refiner_export.onnx_path, FEEDBACK, 0)
