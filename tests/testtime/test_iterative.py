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


@pytest.fixture(scope="module")
def refined_data(refiner_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """300 contexts labelled by the argmax of their state after 30 external steps (all 6 classes occur)."""
    from pathlib import Path

    rng = np.random.default_rng(1)
    context = (rng.standard_normal((300, 6)) * 2).astype(np.float32)
    sess, _ = create_session(refiner_export.onnx_path)
    finals = [
        iterate(sess, {"state": np.zeros((3, 6), np.float32), "context": context[i : i + 3]}, FEEDBACK, 30)
        for i in range(0, 300, 3)
    ]
    y = np.concatenate([f.outputs["output"] for f in finals]).argmax(1)
    assert len(set(y.tolist())) == 6
    path = Path(tmp_path_factory.mktemp("refined")) / "refined.npz"
    np.savez(path, context=context, state=np.zeros_like(context), y=y)  # the states start at zeros
    return path


@pytest.mark.must
@pytest.mark.parametrize("loop", ["external", "onnx"])
def test_evaluate_iterates_with_either_loop(refiner_export: Any, refined_data: Any, loop: str) -> None:
    """``modelexport evaluate --iterate 30 --feedback output:state --loop external|onnx``: the labels are the
    30-step states' argmax, so both loops score 1.0 and one step does not."""
    from modelexport.inference.evaluate import Iteration, evaluate

    full = evaluate(
        refiner_export.onnx_path, refined_data, batch_size=3, iteration=Iteration(30, FEEDBACK, loop)
    )
    assert full.accuracy == 1.0 and full.extra["loop"] == loop and full.extra["iterate"] == 30
    one = evaluate(
        refiner_export.onnx_path, refined_data, batch_size=3, iteration=Iteration(1, FEEDBACK, loop)
    )
    assert one.accuracy < full.accuracy  # one step is not yet the fixed point (0.96 here)


@pytest.mark.must
def test_evaluate_cli_iterative_options(
    refiner_export: Any, refined_data: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from modelexport.cli.app import main

    base = ["evaluate", str(refiner_export.onnx_path), "--data", str(refined_data), "--batch-size", "3"]
    assert (
        main([*base, "--iterate", "30", "--feedback", "output:state", "--loop", "onnx", "--format", "json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["accuracy"] == 1.0 and out["extra"]["feedback"] == {"output": "state"}
    assert main([*base, "--iterate", "3"]) == 1
    assert "--feedback OUTPUT:INPUT" in capsys.readouterr().err
    assert main([*base, "--feedback", "output:state"]) == 1
    assert "need --iterate" in capsys.readouterr().err
    assert (
        main([*base, "--iterate", "3", "--feedback", "output:state", "--tta-transforms", "gaussian_noise"])
        == 1
    )
    assert "iterative inference runs the model as it is" in capsys.readouterr().err
