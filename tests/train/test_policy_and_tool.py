"""Test-time policy search on a deployed program, and the deployed program as a dspy.Tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy
import numpy as np
import pytest
from dspy.teleprompt import Teleprompter

from modelexport.errors import ConfigError, TestTimeError, TrainingError
from modelexport.testtime.policy import TestTimePolicy
from modelexport.train.policy_search import PolicySearchSpace, TestTimePolicyOptimizer, describe_policy
from modelexport.train.program import ClassifierProgram, to_examples
from modelexport.train.tools import ONNXInferenceTool


@pytest.fixture(scope="module")
def searched(deployed_digits: tuple[Any, Path], digits_splits: Any) -> tuple[Any, TestTimePolicyOptimizer]:
    program, onnx_path = deployed_digits
    _, val, _ = digits_splits
    program.deploy(onnx_path)
    space = PolicySearchSpace(tta_transforms=("identity", "scale"), ttt=True)  # bn: the memory statistics
    optimizer = TestTimePolicyOptimizer(space)
    optimizer.compile(program, trainset=to_examples(val))
    return program, optimizer


@pytest.mark.must
def test_policy_never_worse_than_plain_on_its_val_set(searched: Any) -> None:
    program, optimizer = searched
    assert isinstance(optimizer, Teleprompter)
    result = optimizer.result
    assert result.best.accuracy >= result.plain.accuracy
    assert all(result.best.accuracy >= t.accuracy for t in result.trials if t.within_budget)
    assert program.policy == result.best.policy


@pytest.mark.sanity
def test_search_covers_tta_aggregation_and_memory_bn(searched: Any) -> None:
    _, optimizer = searched
    policies = [t.policy for t in optimizer.result.trials]
    assert any(p.is_plain for p in policies)
    assert {p.tta_aggregate for p in policies if p.tta_transforms} == {"mean", "geometric_mean"}
    bn = [p for p in policies if p.ttt == "bn"]
    assert bn and all(p.statistics == "memory" and p.continual for p in bn)  # robust on every stream order
    assert any(p.tta_transforms for p in bn) and any(not p.tta_transforms for p in bn)
    assert all(t.latency_ms > 0 for t in optimizer.result.trials)


@pytest.mark.must
def test_candidates_are_validated_on_shuffled_class_sorted_and_correlated_streams(searched: Any) -> None:
    """Every candidate is measured on stratified, class-sorted and Dirichlet(0.1) streams; BN with the memory
    statistics adapts along each (one stream per order) and is not below plain on any."""
    _, optimizer = searched
    result = optimizer.result
    assert set(result.plain.by_order) == {"stratified", "class-sorted", "dirichlet:0.1"}
    for t in result.trials:
        assert t.accuracy == min(t.by_order.values())
        assert t.safe == all(t.by_order[o] >= result.plain.by_order[o] for o in t.by_order)
    bn = next(t for t in result.trials if t.policy.ttt == "bn" and not t.policy.tta_transforms)
    assert all(bn.by_order[o] >= result.plain.by_order[o] - 0.01 for o in bn.by_order)
    assert result.best.safe
    assumptions = result.to_dict()["stream_assumptions"]
    assert assumptions["orders"] == ["stratified", "class-sorted", "dirichlet:0.1"]
    assert assumptions["batch_size"] == 64
    assert assumptions["adaptation"] in ("episodic", "continual")
    with pytest.raises(TestTimeError, match="valid: as-is"):
        PolicySearchSpace(orders=("sorted",))


@pytest.mark.sanity
def test_latency_budget_is_respected(deployed_digits: tuple[Any, Path], digits_splits: Any) -> None:
    """A budget below every candidate's latency keeps plain inference."""
    program, onnx_path = deployed_digits
    _, val, _ = digits_splits
    program.deploy(onnx_path)
    optimizer = TestTimePolicyOptimizer(
        PolicySearchSpace(tta_transforms=("identity", "hflip"), ttt=False, latency_budget_ms=1e-6)
    )
    optimizer.compile(program, trainset=to_examples(val)[:64])
    assert optimizer.result.best.policy.is_plain
    assert describe_policy(optimizer.result.best.policy) == "plain"


@pytest.mark.must
def test_policy_search_errors(trained_digits: Any) -> None:
    program, _ = trained_digits
    torch_program = ClassifierProgram(program.network)
    with pytest.raises(TrainingError, match="deployed program"):
        TestTimePolicyOptimizer().compile(torch_program, trainset=[])
    with pytest.raises(TestTimeError, match="unknown"):
        PolicySearchSpace(tta_transforms=("identity", "sideways"))
    with pytest.raises(TestTimeError, match="unknown"):
        PolicySearchSpace(tta_aggregate="loudest")
    with pytest.raises(ConfigError, match="latency_budget_ms"):
        PolicySearchSpace(latency_budget_ms=0)


@pytest.mark.sanity
def test_deployed_program_matches_torch(deployed_digits: tuple[Any, Path], digits_splits: Any) -> None:
    """ONNX Runtime (plain policy) and the torch network agree on held-out digits."""
    program, onnx_path = deployed_digits
    _, _, test = digits_splits
    torch_probs = ClassifierProgram(program.network).probabilities(test.images[:64])
    program.deploy(onnx_path, policy=TestTimePolicy())
    np.testing.assert_allclose(program.probabilities(test.images[:64]), torch_probs, atol=1e-4)


@pytest.mark.integration
def test_onnx_inference_tool(deployed_digits: tuple[Any, Path], digits_splits: Any, tmp_path: Path) -> None:
    from PIL import Image

    program, onnx_path = deployed_digits
    _, _, test = digits_splits
    program.deploy(onnx_path, policy=TestTimePolicy())
    tool = ONNXInferenceTool(program)
    assert isinstance(tool, dspy.Tool) and tool.name == "classify_image" and "image_path" in tool.args
    Image.fromarray(test.images[0][:, :, 0]).save(tmp_path / "digit.png")
    out = tool(image_path=str(tmp_path / "digit.png"))
    assert out["label"] == program(image=test.images[0]).label and 0 < out["confidence"] <= 1
    with pytest.raises(Exception, match="cannot read image"):
        tool(image_path=str(tmp_path / "missing.png"))
    agent = dspy.ReAct("image_path -> digit", tools=[tool])  # an agent can hold it (running one needs an LM)
    assert "classify_image" in agent.tools
