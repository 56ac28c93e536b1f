"""Real streams: stream orders, BN prior / running statistics, the collapse guard, the sar method, batch 1."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime import ADAPTATION_METHODS, POLICY_PRESETS, BNAdapter, TestTimeEngine, TestTimePolicy
from modelexport.testtime.corruptions import corrupt
from modelexport.testtime.streams import (
    MIN_BATCH,
    ClassWindow,
    CollapseGuard,
    StreamOrder,
    chi2_critical,
    label_shift_statistic,
    prior_correction,
)
from tests.testtime.robustness import run_stream, stream_accuracy

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
        ("dirichlet:0", "alpha must be a finite number > 0"),
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
        ({"label_shift_alpha": 0.5}, "label_shift_alpha"),
        ({"label_shift_alpha": -0.1}, "label_shift_alpha"),
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
    guard = CollapseGuard(threshold=0.2, window=128, shift_alpha=0.0)
    assert guard.check(one_class, spread, 10) is None  # window not full yet
    assert guard.check(one_class, spread, 10) == "collapse" and guard.resets == 1
    assert guard.adapted == []  # cleared: the stream is reset, the next window starts afresh
    both = CollapseGuard(threshold=0.2, window=128, shift_alpha=0.0)  # the source collapsed too
    assert not any(both.check(one_class, one_class, 10) for _ in range(4))
    assert CollapseGuard(threshold=0.0, window=1, shift_alpha=0.0).check(one_class, spread, 10) is None
    episodic = CollapseGuard(threshold=0.2, window=128, shift_alpha=0.0, episodic=True)
    verdicts = [episodic.check(one_class, spread, 10) for _ in range(4)]  # nothing to reset: every batch
    assert verdicts == [None, "collapse", "collapse", "collapse"] and episodic.resets == 0


@pytest.mark.must
def test_chi2_critical_values_match_scipy() -> None:
    from scipy.stats import chi2

    for dof in (1, 2, 3, 9, 99, 999):
        for alpha in (0.05, 0.01, 0.001):
            rel = 1e-9 if dof <= 2 else 0.01 if dof >= 9 else 0.02
            assert chi2_critical(dof, alpha) == pytest.approx(chi2.ppf(1 - alpha, dof), rel=rel)


@pytest.mark.must
def test_label_shift_test_separates_one_class_batches_from_iid_ones() -> None:
    rng = np.random.default_rng(0)
    critical = chi2_critical(9, 0.001)
    iid = [label_shift_statistic(rng.integers(0, 10, 64).tolist(), [], 10) for _ in range(200)]
    assert np.mean(np.asarray(iid) > critical) <= 0.02  # about alpha: i.i.d. batches pass
    assert label_shift_statistic([3] * 64, [], 10) > 5 * critical  # one class: far beyond
    skewed = rng.choice(10, 512, p=[0.5] + [0.5 / 9] * 9).tolist()  # an i.i.d. but imbalanced stream
    assert label_shift_statistic(skewed[-64:], [], 10) > critical  # against the uniform start ...
    assert label_shift_statistic(skewed[-64:], skewed[:-64], 10) < critical  # ... not against its history


@pytest.mark.must
def test_guard_flags_label_shift_only_for_batch_statistics_methods() -> None:
    rng = np.random.default_rng(1)
    one_class, spread = np.full(64, 4), rng.integers(0, 10, 64)
    guard = CollapseGuard(threshold=0.2, window=256, shift_alpha=0.001)
    assert guard.check(spread, spread, 10) is None
    assert guard.check(one_class, one_class, 10) == "label shift"
    assert guard.check(one_class, one_class, 10, batch_statistics=False) is None
    assert len(guard.history) == 192 and CollapseGuard(shift_alpha=0.0).check(one_class, spread, 10) is None
    # large batches are judged by effect size: an uneven but i.i.d. batch of 450 passes, two classes do not
    uneven = rng.choice(10, 450, p=[0.25] + [0.75 / 9] * 9)
    assert label_shift_statistic(uneven.tolist(), [], 10) > chi2_critical(9, 0.001)  # "significant" ...
    assert CollapseGuard().check(uneven, uneven, 10) is None  # ... but not a label shift
    assert CollapseGuard().check(np.repeat([2, 5], 64), spread, 10) == "label shift"


@pytest.mark.must
def test_prior_correction_sharpens_towards_the_recent_labels() -> None:
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.ones(10), 64).astype(np.float32)
    one = prior_correction(probs[:1], probs[:1])  # one example never changes its arg max
    assert one.argmax() == probs[0].argmax() and one.sum() == pytest.approx(1.0, rel=1e-5)
    recent = np.full((64, 10), 0.02, dtype=np.float32)
    recent[:, 7] = 0.82  # the last 64 predictions: digit 7
    out = prior_correction(probs, recent)
    np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-5)
    assert (out[:, 7] > probs[:, 7]).all() and (out.argmax(1) == 7).sum() > (probs.argmax(1) == 7).sum()
    flat = prior_correction(probs, np.full((64, 10), 0.1, dtype=np.float32))
    np.testing.assert_allclose(flat, probs, rtol=1e-5)  # a uniform label distribution changes nothing


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
    """Running statistics (continual, momentum < 1) adapt at batch 1; batch statistics (episodic) cannot: the
    source predicts (the label-shift guard's small-batch rule), or the batch alone with the guard off."""
    x = digits.x_test[:4]
    plain = TestTimeEngine(digits_export.onnx_path).predict({"x": x})
    policies = [
        TestTimePolicy(
            ttt=ttt, statistics="batch", bn_prior=16.0, episodic=episodic, momentum=1.0 if episodic else 0.1
        )
    ]
    policies.append(policies[0].with_changes(label_shift_alpha=0.0))
    for policy in policies:
        engine = TestTimeEngine(digits_export.onnx_path, policy)
        stream = engine.new_stream()
        probs = np.concatenate([engine.predict({"x": x[i : i + 1]}, stream) for i in range(4)])
        assert probs.shape == (4, 10) and np.isfinite(probs).all()
        np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
        assert stream.batches == (0 if episodic else 4)
        served_by_source = policy.batch_statistics and policy.label_shift_alpha > 0
        assert stream.fallbacks == (4 if served_by_source else 0)
        if served_by_source:
            np.testing.assert_allclose(probs, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.sanity
def test_class_sorted_batches_break_bn_unless_guarded(digits_export: Any, digits: Any) -> None:
    """Real data: each class-sorted batch of 64 holds one or two digits; their statistics are not the data's.
    The label-shift guard serves such batches with the source; i.i.d. batches keep exact BN's gain."""
    x, y, path = digits.x_test, digits.y_test, digits_export.onnx_path
    exact = POLICY_PRESETS["bn-exact"]
    plain, _ = stream_accuracy(path, TestTimePolicy(), x, y, "class-sorted", 64)
    unguarded, _ = stream_accuracy(path, exact.with_changes(label_shift_alpha=0.0), x, y, "class-sorted", 64)
    guarded, stream = run_stream(path, exact, x, y, "class-sorted", 64)
    assert unguarded < plain - 0.1  # the failure
    assert guarded >= plain - 0.01 and stream.fallbacks == 8  # every batch (the last holds 2 < MIN_BATCH)
    assert MIN_BATCH > 2
    shifted = corrupt(x, "contrast", 3)
    plain_iid, _ = stream_accuracy(path, TestTimePolicy(), shifted, y, "shuffle", 64)
    iid, stream = run_stream(path, exact, shifted, y, "shuffle", 64)
    assert iid > plain_iid + 0.5 and stream.fallbacks <= 2  # adaptation still helps on i.i.d. batches
    assert stream_accuracy(path, POLICY_PRESETS["bn-stream"], x, y, "class-sorted", 64)[0] >= plain - 0.01


@pytest.mark.sanity
def test_label_shifted_batch_teaches_a_continual_stream_nothing(digits_export: Any, digits: Any) -> None:
    order = StreamOrder.parse("class-sorted").indices(digits.y_test)
    policy = TestTimePolicy(ttt="tent", statistics="batch", learning_rate=1e-2)  # batch statistics, continual
    engine = TestTimeEngine(digits_export.onnx_path, policy)
    stream = engine.new_stream()
    result = engine.run({"x": digits.x_test[order[:64]]}, stream)
    assert result.fallback == "label shift" and stream.state is None and stream.fallbacks == 1


@pytest.mark.sanity
def test_stream_running_statistics_reset_every_n_batches(digits_export: Any, digits: Any) -> None:
    policy = TestTimePolicy(ttt="bn", statistics="batch", momentum=0.1, reset_every=2)
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
    policy = TestTimePolicy(ttt="sar", statistics="batch", bn_prior=16.0, learning_rate=1e-2)
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
    strict = TestTimePolicy(ttt="sar", statistics="batch", bn_prior=16.0, reliable_entropy=1e-6)
    engine2 = TestTimeEngine(digits_export.onnx_path, strict)  # ... but none is reliable enough
    s2 = engine2.new_stream()
    engine2.predict(batch, s2)
    for n in scales:  # no example passed the entropy filter: the affine parameters stay the source's
        np.testing.assert_array_equal(s2.state[n], adapter.source_state[n])  # type: ignore[index]


@pytest.mark.sanity
def test_collapse_guard_resets_a_collapsing_stream(digits_export: Any, digits: Any) -> None:
    """Tent with a huge learning rate on a continual stream collapses; the collapse guard alone resets it to
    the source; with the label-shift guard too, the collapsing batches teach the stream nothing."""
    x, y, path = digits.x_test, digits.y_test, digits_export.onnx_path
    wild = TestTimePolicy(
        ttt="tent",
        statistics="batch",
        learning_rate=1.0,
        ttt_iterations=3,
        collapse_window=64,
        label_shift_alpha=0.0,
    )
    unguarded, _ = stream_accuracy(path, wild.with_changes(collapse_threshold=0.0), x, y, "shuffle", 32)
    guarded, resets = stream_accuracy(path, wild, x, y, "shuffle", 32)
    assert resets >= 1
    assert guarded > unguarded + 0.1
    plain, _ = stream_accuracy(path, TestTimePolicy(), x, y, "shuffle", 32)
    both, _ = stream_accuracy(path, wild.with_changes(label_shift_alpha=0.001), x, y, "shuffle", 32)
    assert both >= plain - 0.01


@pytest.mark.must
def test_the_class_window_counts_the_last_predictions_whatever_the_batch_sizes() -> None:
    """The lazy collapse check's window writes batches into its ring as slices where they fit: its counts must
    be those of the last ``size`` predictions, before and after the ring wraps, for any batch size."""
    rng = np.random.default_rng(0)
    window, seen = ClassWindow(64, 5), np.zeros(0, np.int64)
    for n in rng.choice([1, 7, 40, 64, 300], 200):
        classes = rng.integers(0, 5, int(n))
        window.push(classes)
        seen = np.concatenate([seen, classes])[-64:]
        np.testing.assert_array_equal(window.counts(5), np.bincount(seen, minlength=5))
        assert sorted(window.ring[window.ring >= 0].tolist()) == sorted(seen.tolist())
