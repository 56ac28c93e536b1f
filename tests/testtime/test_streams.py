"""Real streams: stream orders, BN prior / running statistics, the collapse guard, the sar method, batch 1."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime import ADAPTATION_METHODS, BNAdapter, TestTimeEngine, TestTimePolicy
from modelexport.testtime.streams import CollapseGuard, StreamOrder
from tests.testtime.robustness import stream_accuracy

LABELS = np.repeat(np.arange(10), 30)


@pytest.mark.must
def test_stream_orders_are_seeded_permutations() -> None:
    y = np.random.default_rng(1).permutation(LABELS)
    for spec in ("as-is", "shuffle", "class-sorted", "dirichlet:0.1", "dirichlet:100"):
        idx = StreamOrder.parse(spec, seed=3).indices(y)
        assert sorted(idx.tolist()) == list(range(len(y)))
        np.testing.assert_array_equal(idx, StreamOrder.parse(spec, seed=3).indices(y))
    np.testing.assert_array_equal(StreamOrder.parse("as-is").indices(y), np.arange(len(y)))
    assert (np.diff(y[StreamOrder.parse("class-sorted").indices(y)]) >= 0).all()

    def runs(spec: str) -> int:  # label changes along the stream: fewer = more correlated
        return int((np.diff(y[StreamOrder.parse(spec).indices(y)]) != 0).sum())

    assert runs("class-sorted") == 9 < runs("dirichlet:0.1") < runs("shuffle")
    assert str(StreamOrder.parse("dirichlet:0.1")) == "dirichlet:0.1"


@pytest.mark.must
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sorted", "valid: as-is, shuffle"),
        ("dirichlet:0", "alpha must be > 0"),
        ("shuffle:2", "no parameter"),
        ("dirichlet:x", "must be a number"),
    ],
)
def test_bad_stream_orders_are_refused(spec: str, message: str) -> None:
    with pytest.raises(TestTimeError, match=message):
        StreamOrder.parse(spec)


@pytest.mark.must
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bn_prior": -1.0}, "bn_prior"),
        ({"reset_every": 0}, "reset_every"),
        ({"collapse_threshold": 1.0}, "collapse_threshold"),
        ({"collapse_window": 0}, "collapse_window"),
        ({"reliable_entropy": 0.0}, "reliable_entropy"),
        ({"ttt": "eata"}, "valid: none, bn, tent, sar"),
    ],
)
def test_policy_ranges_are_checked(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TestTimeError, match=message):
        TestTimePolicy(**changes)


@pytest.mark.must
def test_collapse_guard_trips_only_when_adaptation_is_narrower_than_the_source() -> None:
    spread, one_class = np.arange(64) % 10, np.zeros(64, dtype=np.int64)
    guard = CollapseGuard(threshold=0.2, window=128)
    assert not guard.observe(one_class, spread, 10)  # window not full yet
    assert guard.observe(one_class, spread, 10) and guard.resets == 1
    assert guard.adapted == []  # cleared: the next window starts afresh
    both = CollapseGuard(threshold=0.2, window=128)  # the source collapsed too: resetting gains nothing
    assert not any(both.observe(one_class, one_class, 10) for _ in range(4))
    assert not CollapseGuard(threshold=0.0, window=1).observe(one_class, spread, 10)


@pytest.mark.must
def test_bn_prior_blends_source_and_batch_as_a_mixture(digits_export: Any, digits: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    feeds = {"x": digits.x_test[:48]}
    batch = adapter.adapt(feeds, iterations=1)
    blended = adapter.adapt(feeds, iterations=1, prior_strength=16.0)
    w = 48 / (48 + 16)
    layer = adapter.layers[0]
    src_m, src_v = (adapter.source_state[n].astype(np.float64) for n in (layer.mean, layer.var))
    b_m, b_v = batch[layer.mean].astype(np.float64), batch[layer.var].astype(np.float64)
    np.testing.assert_allclose(blended[layer.mean], (1 - w) * src_m + w * b_m, rtol=1e-5, atol=1e-6)
    expected_var = (1 - w) * src_v + w * b_v + w * (1 - w) * (b_m - src_m) ** 2
    np.testing.assert_allclose(blended[layer.var], expected_var, rtol=1e-5, atol=1e-6)
    with pytest.raises(TestTimeError, match="prior_strength"):
        adapter.adapt(feeds, prior_strength=-1.0)


@pytest.mark.sanity
@pytest.mark.parametrize("ttt", ["bn", "tent", "sar"])
@pytest.mark.parametrize("episodic", [True, False])
def test_batch_size_one_works_for_every_method(
    digits_export: Any, digits: Any, ttt: str, episodic: bool
) -> None:
    engine = TestTimeEngine(
        digits_export.onnx_path, TestTimePolicy(ttt=ttt, bn_prior=16.0, episodic=episodic)
    )
    stream = engine.new_stream()
    probs = np.concatenate([engine.predict({"x": digits.x_test[i : i + 1]}, stream) for i in range(4)])
    assert probs.shape == (4, 10) and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    assert stream.batches == (0 if episodic else 4)


@pytest.mark.sanity
def test_class_sorted_batches_break_bn_but_not_the_stream_statistics(digits_export: Any, digits: Any) -> None:
    """Real data: each class-sorted batch of 64 holds one or two digits; their statistics are not the data's."""
    x, y, path = digits.x_test, digits.y_test, digits_export.onnx_path
    plain, _ = stream_accuracy(path, TestTimePolicy(), x, y, "class-sorted", 64)
    exact, _ = stream_accuracy(path, TestTimePolicy(ttt="bn"), x, y, "class-sorted", 64)
    stream = TestTimePolicy(ttt="bn", episodic=False, bn_prior=256.0, momentum=0.02)
    robust, _ = stream_accuracy(path, stream, x, y, "class-sorted", 64)
    assert exact < plain - 0.1  # the failure
    assert robust >= plain - 0.01


@pytest.mark.sanity
def test_stream_running_statistics_reset_every_n_batches(digits_export: Any, digits: Any) -> None:
    policy = TestTimePolicy(ttt="bn", episodic=False, momentum=0.1, reset_every=2)
    engine = TestTimeEngine(digits_export.onnx_path, policy)
    stream = engine.new_stream()
    batches = [{"x": digits.x_test[i : i + 32]} for i in range(0, 96, 32)]
    for b in batches[:2]:
        engine.predict(b, stream)
    assert stream.seen == 64
    third = engine.predict(batches[2], stream)  # reset first: as if the stream started here
    fresh = engine.new_stream()
    np.testing.assert_allclose(third, engine.predict(batches[2], fresh), rtol=1e-5, atol=1e-6)


@pytest.mark.sanity
def test_sar_learns_only_from_reliable_new_examples(digits_export: Any, digits: Any) -> None:
    assert "sar" in ADAPTATION_METHODS
    policy = TestTimePolicy(ttt="sar", episodic=False, bn_prior=16.0, learning_rate=1e-2)
    engine = TestTimeEngine(digits_export.onnx_path, policy)
    adapter = engine.adapter
    assert adapter is not None
    stream = engine.new_stream()
    batch = {"x": digits.x_test[:64]}
    engine.predict(batch, stream)
    scales = [layer.scale for layer in adapter.layers]
    after_one = {n: stream.state[n].copy() for n in scales}  # type: ignore[index]
    assert any(not np.array_equal(after_one[n], adapter.source_state[n]) for n in scales)  # it learned
    assert "probs" in stream.memory
    stream.memory["probs"] = np.full(10, 0.1)  # a uniform average: every confident row is new again ...
    strict = TestTimePolicy(ttt="sar", episodic=False, bn_prior=16.0, reliable_entropy=1e-6)
    engine2 = TestTimeEngine(digits_export.onnx_path, strict)  # ... but none is reliable enough
    s2 = engine2.new_stream()
    engine2.predict(batch, s2)
    for n in scales:  # no example passed the entropy filter: the affine parameters stay the source's
        np.testing.assert_array_equal(s2.state[n], adapter.source_state[n])  # type: ignore[index]


@pytest.mark.sanity
def test_collapse_guard_resets_a_collapsing_stream(digits_export: Any, digits: Any) -> None:
    """Tent with a huge learning rate on a continual stream collapses; the guard resets it to the source."""
    x, y, path = digits.x_test, digits.y_test, digits_export.onnx_path
    wild = TestTimePolicy(ttt="tent", episodic=False, learning_rate=1.0, ttt_iterations=3, collapse_window=64)
    unguarded, _ = stream_accuracy(path, wild.with_changes(collapse_threshold=0.0), x, y, "shuffle", 32)
    guarded, resets = stream_accuracy(path, wild, x, y, "shuffle", 32)
    assert resets >= 1
    assert guarded > unguarded + 0.1
