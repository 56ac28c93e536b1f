"""TestTimePolicy: validation with the valid choices in the message, round trip, presets, registry coverage."""

from __future__ import annotations

import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime.policy import ADAPTATION_METHODS, POLICY_PRESETS, TestTimePolicy, policy_preset


@pytest.mark.must
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tta_transforms": "identity,warp"}, "unknown TTA transform"),
        ({"tta_transforms": "hflip", "modality": "text"}, "valid \\(text: identity, word_dropout"),
        ({"tta_aggregate": "avg"}, "valid: mean"),
        ({"ttt": "sgd"}, "valid: none, bn, tent"),
        ({"modality": "audio"}, "modality must be one of"),
        ({"adaptive_threshold": 1.5}, "adaptive_threshold"),
        ({"ttt_iterations": 0}, "ttt_iterations"),
        ({"momentum": 0.0}, "momentum"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"mc_dropout": 1}, "mc_dropout"),
        ({"learning_rate": float("nan")}, "learning_rate must be a finite number > 0, got nan"),
        ({"statistics": "batch", "bn_prior": float("inf")}, "bn_prior must be a finite number"),
        ({"seed": -1}, "seed must be an integer in"),
        ({"seed": 2**64}, "seed must be an integer in"),
    ],
)
def test_invalid_policies_fail_with_the_valid_choices(kwargs: dict, message: str) -> None:
    with pytest.raises(TestTimeError, match=message):
        TestTimePolicy(**kwargs)


@pytest.mark.sanity
def test_round_trip_and_comma_string() -> None:
    p = TestTimePolicy(
        tta_transforms="identity, hflip", ttt="bn", mc_dropout=4, adaptive_threshold=0.8, seed=3
    )
    assert p.tta_transforms == ("identity", "hflip")
    assert TestTimePolicy.from_dict(p.to_dict()) == p
    assert not p.is_plain and TestTimePolicy().is_plain
    with pytest.raises(TestTimeError, match="unknown test-time policy keys"):
        TestTimePolicy.from_dict({"tta": ["identity"]})


@pytest.mark.sanity
@pytest.mark.parametrize("name", list(POLICY_PRESETS))
def test_presets_are_valid_and_named(name: str) -> None:
    assert policy_preset(name) == POLICY_PRESETS[name]
    assert TestTimePolicy.from_dict(POLICY_PRESETS[name].to_dict()) == POLICY_PRESETS[name]


@pytest.mark.sanity
@pytest.mark.parametrize("method", list(ADAPTATION_METHODS))
def test_every_adaptation_method_builds_a_policy(method: str) -> None:
    assert TestTimePolicy(ttt=method).ttt == method
    with pytest.raises(TestTimeError, match="valid"):
        policy_preset("fastest")
