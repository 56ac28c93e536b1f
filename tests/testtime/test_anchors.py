"""Source anchors (``testtime/anchors.py``): the record, the stream's shift window, and the deep variances and
means a noisy stream measures against them."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from modelexport.errors import TestTimeError
from modelexport.metadata import read_metadata, write_metadata
from modelexport.metadata.schema import KEY_INPUT_NOISE, KEY_SOURCE_ANCHORS
from modelexport.testtime import engine as engine_module
from modelexport.testtime.anchors import (
    FIRST_MEANS,
    MEANS_CLASSES,
    MEANS_FADE,
    MIN_PER_CLASS,
    PER_CLASS,
    AnchorComparison,
    ShiftWindow,
    SourceAnchors,
    classes_share,
    means_fade,
)
from modelexport.testtime.corruptions import corrupt
from modelexport.testtime.engine import TestTimeEngine, calibrate_anchors, calibrate_restoration
from modelexport.testtime.memory import SUPPORT, StatisticsMemory
from modelexport.testtime.policy import TestTimePolicy

from .robustness import run_stream


@pytest.mark.smoke
def test_the_pipeline_keeps_a_few_examples_of_each_class_within_a_budget(digits: Any) -> None:
    x, y = digits.x_train, digits.y_train
    anchors = SourceAnchors.select(x, y)
    assert anchors is not None
    assert np.array_equal(np.bincount(anchors.labels), [PER_CLASS] * 10)
    assert anchors.x.dtype == np.float32 and anchors.x.shape[1:] == x.shape[1:]
    # every anchor is one of the given examples, with its label
    index = {row.tobytes(): label for row, label in zip(x.astype(np.float32), y, strict=True)}
    assert all(index[a.tobytes()] == label for a, label in zip(anchors.x, anchors.labels, strict=True))
    per_value = x[0].size * 10
    assert np.bincount(SourceAnchors.select(x, y, max_values=3 * per_value).labels).tolist() == [3] * 10  # type: ignore[union-attr]
    assert SourceAnchors.select(x, y, max_values=per_value) is None  # one a class: no within-class variance
    lone = np.concatenate([y[y != 0], [0]])  # class 0 has one example: left out, the others kept
    kept = SourceAnchors.select(x[: len(lone)], lone)
    assert kept is not None and 0 not in kept.labels and len(np.unique(kept.labels)) == 9
    with pytest.raises(ValueError, match="labels"):
        SourceAnchors.select(x, y[:-1])


@pytest.mark.must
def test_the_record_round_trips_and_a_malformed_one_is_refused_with_a_way_around(digits: Any) -> None:
    anchors = SourceAnchors.select(digits.x_train, digits.y_train)
    assert anchors is not None
    back = SourceAnchors.from_dict(anchors.to_dict())
    np.testing.assert_array_equal(back.labels, anchors.labels)
    np.testing.assert_allclose(back.x, anchors.x, rtol=1e-3, atol=1e-3)  # stored as float16
    record = anchors.to_dict()
    for broken in (
        {**record, "encoding": "raw"},
        {**record, "labels": record["labels"][:-1]},
        {**record, "data": "not base64!"},
        {**record, "shape": [3, 2]},
        {**record, "shape": []},
        {k: v for k, v in record.items() if k != "data"},
    ):
        with pytest.raises(TestTimeError, match="source_anchors record is malformed") as err:
            SourceAnchors.from_dict(broken)
        assert "--no-anchors" in str(err.value.hint)


@pytest.mark.smoke
def test_the_shift_window_keeps_a_streams_last_examples_and_drops_measured_rows() -> None:
    window = ShiftWindow(5)
    for start in range(0, 12, 3):
        window.push_inputs(np.arange(start, start + 3, dtype=np.float32)[:, None])
    assert len(window) == 5
    inputs, rows, classes = window.parts()
    assert inputs is not None and rows is None and classes is None
    np.testing.assert_array_equal(inputs[:, 0], np.arange(7, 12))
    one = ShiftWindow(4)
    one.push_inputs(np.zeros((9, 1)))  # a batch larger than the window
    assert len(one) == 4 and one.parts()[0].shape == (4, 1)  # type: ignore[union-attr]
    # a small batch's rows: kept as its pass gave them, dropped at a measurement; inputs are kept
    mixed = ShiftWindow(6)
    mixed.push_inputs(np.zeros((2, 1)))
    for i in range(5):
        mixed.push_rows(np.full((1, 4), float(i)), np.array([i]))
    inputs, rows, classes = mixed.parts()
    assert len(mixed) == 6 and inputs is not None and inputs.shape == (1, 1)  # the oldest input fell out
    assert rows is not None and classes is not None
    np.testing.assert_array_equal(rows[:, 0], np.arange(5))
    np.testing.assert_array_equal(classes, np.arange(5))
    mixed.measured()
    assert len(mixed) == 2 and mixed.parts()[1] is None  # both inputs are back: nothing beyond the window


def _rows(means: np.ndarray, spread: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per-example (mean, mean square) rows of examples whose per-channel values are ``means`` plus noise of
    standard deviation ``spread`` (one value per example and channel: its mean square is the square)."""
    values = means + spread * rng.standard_normal((n, len(means)))
    return np.concatenate([values, values**2], axis=1)


@pytest.mark.must
def test_the_deep_variances_are_the_anchors_scaled_by_the_within_class_ratio_of_one_class() -> None:
    """A stream of one class whose within-class spread is twice the anchors' (variance 4x) in the deep layer's
    channels and unchanged in the stem: the deep layer's estimate is the variance of all the anchors -- every
    class, between-class spread included -- times 4; the stem keeps ``base``. No class with two examples and
    two anchors: no estimate."""
    rng = np.random.default_rng(0)
    width, stem, deep = 6, slice(0, 2), slice(2, 6)
    centres = np.repeat(3.0 * np.arange(5)[:, None], width, axis=1)  # five classes, 3 apart
    spread = np.ones(width)
    anchors = np.concatenate([_rows(centres[c], spread, 400, rng) for c in range(5)])
    labels = np.repeat(np.arange(5), 400)
    doubled = np.where(np.arange(width) >= 2, 2.0, 1.0)
    stream = _rows(centres[3], spread * doubled, 2000, rng)
    base = np.full(width, 7.0)
    out = AnchorComparison(stream, np.full(2000, 3), anchors, labels, [deep]).variances(base)
    assert out is not None
    moments = anchors.mean(axis=0)
    pooled = moments[width:] - moments[:width] ** 2
    np.testing.assert_allclose(out[deep], 4.0 * pooled[deep], rtol=0.1)
    np.testing.assert_array_equal(out[stem], base[stem])
    assert pooled[deep].min() > 5.0  # the between-class spread is in it, not just the class's own
    assert AnchorComparison(stream[:1], np.array([3]), anchors, labels, [deep]).variances(base) is None
    no_such_anchors = AnchorComparison(stream[:9], np.full(9, 7), anchors, labels, [deep])
    assert no_such_anchors.variances(base) is None
    assert MIN_PER_CLASS == 2


@pytest.mark.must
def test_the_deep_means_are_the_anchors_moved_by_the_streams_difference_from_its_classes_anchors() -> None:
    """Two classes streamed, their deep channels 2 above their own anchors (the stem's as the anchors): the
    deep layer's estimate is the mean of all the anchors -- every class -- plus 2, whatever classes the stream
    holds; the stem keeps ``base``. No class with an anchor: no estimate."""
    rng = np.random.default_rng(0)
    width, stem, deep = 6, slice(0, 2), slice(2, 6)
    centres = np.repeat(3.0 * np.arange(5)[:, None], width, axis=1)
    spread = np.ones(width)
    anchors = np.concatenate([_rows(centres[c], spread, 400, rng) for c in range(5)])
    labels = np.repeat(np.arange(5), 400)
    moved = np.where(np.arange(width) >= 2, 2.0, 0.0)
    stream = np.concatenate([_rows(centres[c] + moved, spread, 1000, rng) for c in (1, 3)])
    classes = np.repeat([1, 3], 1000)
    base = np.full(width, 7.0)
    out = AnchorComparison(stream, classes, anchors, labels, [deep]).means(base)
    assert out is not None
    np.testing.assert_allclose(out[deep], anchors[:, deep].mean(axis=0) + 2.0, atol=0.1)
    np.testing.assert_array_equal(out[stem], base[stem])
    assert AnchorComparison(stream[:5], np.full(5, 7), anchors, labels, [deep]).means(base) is None


@pytest.mark.smoke
def test_the_deep_means_fade_by_the_memorys_class_support_not_by_a_stray_entry_per_class() -> None:
    """A full memory of one class with a stray misprediction of each other class covers every class, but a
    stray entry supports a 6.4th of its class (half its fair share is 6.4 entries): a support of 0.24, and the
    measured deep means still move by most of the variances' share. Full support: they do not move."""
    memory = StatisticsMemory(128, 4, 10)
    memory.add(np.ones((128, 4)), np.r_[np.zeros(119, np.int64), np.arange(1, 10)])
    fair = SUPPORT * 128 / 10
    assert memory.coverage == 1.0
    assert memory.support == pytest.approx((1 + 9 / fair) / 10)
    assert (
        means_fade(memory.support) == pytest.approx((1 - memory.support) ** 2)
        and means_fade(memory.support) > 0.5
    )
    assert means_fade(1.0) == 0.0 and means_fade(0.1) == pytest.approx(0.81)
    assert MEANS_FADE == 2


@pytest.mark.smoke
def test_a_shift_read_off_few_classes_moves_the_deep_means_less() -> None:
    """The effective number of classes over itself plus ``MEANS_CLASSES``: one class a third, two equal ones a
    half, ten equal ones five sixths; a class with a few strays a little more than one class."""
    assert MEANS_CLASSES == 2
    assert classes_share(np.full(40, 3)) == pytest.approx(1 / 3)
    assert classes_share(np.repeat([1, 4], 20)) == pytest.approx(1 / 2)
    assert classes_share(np.repeat(np.arange(10), 4)) == pytest.approx(10 / 12)
    assert 1 / 3 < classes_share(np.r_[np.zeros(37, np.int64), [5, 6, 7]]) < 1 / 2


@pytest.fixture(scope="module")
def anchored(digits: Any, digits_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits CNN with an input-noise record that denoises (strength 1: its calibration turns denoising
    off, ``test_denoise.py``) and the source anchors as the image pipeline wrote them before it kept
    ``PER_CLASS`` a class: twice as many, of which an engine measures with the first ``PER_CLASS`` of each."""
    path = tmp_path_factory.mktemp("anchored") / "model.onnx"
    shutil.copy(digits_export.onnx_path, path)
    record = calibrate_restoration(path, digits.x_train, digits.x_test[:256], digits.y_test[:256])
    anchors = SourceAnchors.select(digits.x_train, digits.y_train, per_class=2 * PER_CLASS)
    assert anchors is not None
    write_metadata(
        path,
        {KEY_INPUT_NOISE: replace(record, strength=1.0).to_dict(), KEY_SOURCE_ANCHORS: anchors.to_dict()},
    )
    return path


@pytest.mark.must
def test_a_noisy_stream_measures_its_deep_variances_against_the_anchors_and_a_clean_one_runs_as_before(
    anchored: Path, digits: Any, digits_export: Any
) -> None:
    """Gaussian noise read class by class: the first batch is measured before it is predicted, and the stream's
    prior moves its deep layers' variances and means (the stem's stay the source's) toward the anchors'
    measured under its statistics; the next measurement, while the memory does not yet support every class,
    moves the deep means again (the stem's stay); the predictions differ from ``anchors=False``. Clean digits open
    nothing: no measurement pass, the engine's own prior, and the same predictions as without anchors. A model
    without the record, or the policy's ``anchors=False``, keeps no shift window."""
    x, y = digits.x_test[256:576], digits.y_test[256:576]
    noisy = corrupt(x, "gaussian_noise", 4, seed=0)
    engine = TestTimeEngine(anchored, TestTimePolicy(ttt="bn"))
    off = TestTimeEngine(anchored, TestTimePolicy(ttt="bn", anchors=False))
    prior, adapter = engine._prior, engine.adapter
    assert engine._anchors is not None and prior is not None and adapter is not None
    assert off._anchors is None
    recorded = SourceAnchors.from_dict(read_metadata(anchored)[KEY_SOURCE_ANCHORS])
    assert np.bincount(recorded.labels).tolist() == [2 * PER_CLASS] * 10  # an older record: the first half
    first_of_each = np.sort(
        np.concatenate([np.flatnonzero(recorded.labels == c)[:PER_CLASS] for c in range(10)])
    )
    np.testing.assert_array_equal(engine._anchors.labels, recorded.labels[first_of_each])
    np.testing.assert_array_equal(engine._anchors.x, recorded.x[first_of_each])
    assert recorded.first(2 * PER_CLASS) is recorded
    stem = adapter.channels[0]
    deep = np.concatenate([np.arange(p.start, p.stop) for p in engine._deep])

    first, ordered = engine.new_stream(), noisy[np.argsort(y, kind="stable")]
    engine.predict({"x": ordered[:40]}, first)
    assert first.prior is not None and first.prior[0] == 40  # measured on its own 40 inputs, again at 40
    own = first.prior[1]
    assert not np.allclose(own.var[deep], prior.var[deep], rtol=0.05)
    np.testing.assert_array_equal(own.var[stem], prior.var[stem])
    np.testing.assert_array_equal(own.mean[stem], prior.mean[stem])
    assert np.abs(own.mean[deep] - prior.mean[deep]).max() > 1e-3  # read again under its variances
    for start in range(40, 200, 40):  # until measured again, against the few classes its memory holds
        engine.predict({"x": ordered[start : start + 40]}, first)
        if first.prior[0] > 40:
            break
    again, support = first.prior[1], first.bank.support  # type: ignore[union-attr]
    assert first.prior[0] > 40 and support < 1.0, (first.prior[0], support)
    assert np.abs(again.mean[deep] - prior.mean[deep]).max() > 1e-3
    np.testing.assert_array_equal(again.mean[stem], prior.mean[stem])

    acc, stream = run_stream(engine, engine.policy, noisy, y, "class-sorted", 32)
    acc_off, stream_off = run_stream(off, off.policy, noisy, y, "class-sorted", 32)
    assert stream.prior is not None and stream.prior[1] is not prior  # type: ignore[attr-defined]
    assert stream_off.window is None and stream_off.prior is None  # type: ignore[attr-defined]
    assert acc != acc_off

    clean_on, clean_stream = run_stream(engine, engine.policy, x, y, "class-sorted", 32)
    clean_off, _ = run_stream(off, off.policy, x, y, "class-sorted", 32)
    assert clean_stream.prior is not None and clean_stream.prior[1] is prior  # type: ignore[attr-defined]
    assert clean_on == clean_off
    plain = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    assert plain._anchors is None
    _, unrecorded = run_stream(plain, plain.policy, noisy, y, "class-sorted", 32)
    assert unrecorded.window is None  # type: ignore[attr-defined]


@pytest.mark.must
def test_a_first_batch_reads_its_deep_means_again_under_the_variances_it_measured(
    anchored: Path, digits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A noisy class-ordered stream's first batch of 40: one pass of its inputs and the anchors measures the
    deep variances, a second, under them, the deep means, then the batch is predicted. The means move
    ``FIRST_MEANS`` of the variances' share of the way: at a share of 1 exactly twice as far; the variances,
    the stem and the predicting pass's inputs are the same either way."""
    x, y = digits.x_test[256:576], digits.y_test[256:576]
    ordered = corrupt(x, "gaussian_noise", 4, seed=0)[np.argsort(y, kind="stable")][:40]
    priors, sizes = [], []
    for share in (FIRST_MEANS, 1.0):
        monkeypatch.setattr(engine_module, "FIRST_MEANS", share)
        engine = TestTimeEngine(anchored, TestTimePolicy(ttt="bn"))
        adapter, anchors = engine.adapter, engine._anchors
        assert adapter is not None and anchors is not None
        run = adapter.run_with_statistics

        def counted(
            feeds: dict[str, np.ndarray], *args: Any, run: Any = run, name: str = engine.input_name, **kw: Any
        ) -> Any:
            sizes.append(len(feeds[name]))
            return run(feeds, *args, **kw)

        monkeypatch.setattr(adapter, "run_with_statistics", counted)
        stream = engine.new_stream()
        engine.predict({engine.input_name: ordered}, stream)
        assert stream.prior is not None
        priors.append(stream.prior[1])
    measured = 40 + len(anchors.labels)
    assert sizes[:3] == [measured, measured, 40] and sizes[3:6] == [measured, measured, 40], sizes
    prior = engine._prior
    assert prior is not None
    deep = np.concatenate([np.arange(p.start, p.stop) for p in engine._deep])
    stem = adapter.channels[0]
    half, full = (p.mean - prior.mean for p in priors)
    assert np.abs(half[deep]).max() > 1e-3
    np.testing.assert_allclose(full[deep], half[deep] / FIRST_MEANS, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(half[stem], 0.0)
    np.testing.assert_array_equal(priors[0].var, priors[1].var)
    assert FIRST_MEANS == 0.5


@pytest.mark.must
def test_a_remeasurement_moves_the_deep_means_as_far_as_its_examples_span_classes(
    anchored: Path, digits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noisy digits read class by class in batches of 40 are measured again after the first batch, the window's
    examples run again: the deep means move ``classes_share`` of what the memory's support leaves them, the
    effective number of classes those examples were predicted as over itself plus ``MEANS_CLASSES``. With that
    share taken as 1 they move exactly that much farther, the variances the same; the stem's means stay the
    source's. A stream of single examples, whose window is not run again, never asks."""
    x, y = digits.x_test[256:576], digits.y_test[256:576]
    ordered = corrupt(x, "gaussian_noise", 4, seed=0)[np.argsort(y, kind="stable")]
    asked: list[tuple[np.ndarray, float]] = []

    def recorded(classes: np.ndarray) -> float:
        share = classes_share(classes)
        asked.append((classes.copy(), share))
        return share

    def measured_again(share: Any) -> tuple[TestTimeEngine, Any]:
        monkeypatch.setattr(engine_module, "classes_share", share)
        engine = TestTimeEngine(anchored, TestTimePolicy(ttt="bn"))
        stream = engine.new_stream()
        for start in range(0, len(ordered), 40):
            engine.predict({"x": ordered[start : start + 40]}, stream)
            if stream.prior is not None and stream.prior[0] > 40:
                return engine, stream.prior[1]
        raise AssertionError("not measured again")

    engine, own = measured_again(recorded)
    _, whole = measured_again(lambda classes: 1.0)
    assert len(asked) == 1
    classes, share = asked[0]
    counts = np.bincount(classes)
    p = counts[counts > 0] / len(classes)
    k = float(np.exp(-(p * np.log(p)).sum()))
    assert share == pytest.approx(k / (k + MEANS_CLASSES)) and 1 / 3 <= share < 1, (share, counts)
    prior, adapter = engine._prior, engine.adapter
    assert prior is not None and adapter is not None
    deep = np.concatenate([np.arange(q.start, q.stop) for q in engine._deep])
    moved = own.mean[deep] - prior.mean[deep]
    assert np.abs(moved).max() > 1e-4
    np.testing.assert_allclose(moved, share * (whole.mean[deep] - prior.mean[deep]), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(own.var, whole.var)
    np.testing.assert_array_equal(own.mean[adapter.channels[0]], prior.mean[adapter.channels[0]])

    asked.clear()
    monkeypatch.setattr(engine_module, "classes_share", recorded)
    single = TestTimeEngine(anchored, TestTimePolicy(ttt="bn"))
    stream = single.new_stream()
    for i in range(100):
        single.predict({"x": ordered[i : i + 1]}, stream)
    assert stream.prior is not None and stream.prior[1] is not single._prior and asked == []


@pytest.mark.must
def test_a_batch_one_stream_measures_the_anchors_alone_against_the_rows_its_passes_gave(
    anchored: Path, digits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One noisy example at a time, read class by class: the engine's passes, counted (each still runs), are
    one example each but the three measurements in 200 examples -- from 32 examples on, and each time the
    stream has doubled -- which run the anchors alone, not the window's inputs again. The measured prior
    moves the deep variances and means, not the stem's, as at batch 40 after the first batch."""
    x, y = digits.x_test[256:576], digits.y_test[256:576]
    noisy = corrupt(x, "gaussian_noise", 4, seed=0)[np.argsort(y, kind="stable")][:200]
    engine = TestTimeEngine(anchored, TestTimePolicy(ttt="bn"))
    adapter, prior, anchors = engine.adapter, engine._prior, engine._anchors
    assert adapter is not None and prior is not None and anchors is not None
    sizes: list[int] = []
    run = adapter.run_with_statistics

    def counted(feeds: dict[str, np.ndarray], *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(feeds[engine.input_name]))
        return run(feeds, *args, **kwargs)

    monkeypatch.setattr(adapter, "run_with_statistics", counted)
    stream, measured = engine.new_stream(), []
    for i in range(len(noisy)):
        engine.predict({engine.input_name: noisy[i : i + 1]}, stream)
        if stream.prior is not None and (not measured or stream.prior is not measured[-1][0]):
            measured.append((stream.prior, stream.bank.support))  # type: ignore[union-attr]
    assert [n for n in sizes if n > 1] == [len(anchors.labels)] * 3
    assert stream.prior is not None and 2 * 128 <= stream.prior[0] <= 2 * 200  # twice its length then
    assert len(measured) == 3 and measured[0][1] < 1.0, [c for _, c in measured]
    own, deep = measured[0][0][1], np.concatenate([np.arange(p.start, p.stop) for p in engine._deep])
    assert not np.allclose(own.var[deep], prior.var[deep], rtol=0.05)
    np.testing.assert_array_equal(own.var[adapter.channels[0]], prior.var[adapter.channels[0]])
    assert np.abs(own.mean[deep] - prior.mean[deep]).max() > 1e-3
    np.testing.assert_array_equal(own.mean[adapter.channels[0]], prior.mean[adapter.channels[0]])


@pytest.mark.smoke
def test_the_policy_switch_is_a_boolean() -> None:
    assert TestTimePolicy(ttt="bn").anchors is True
    with pytest.raises(TestTimeError, match="anchors must be true or false"):
        TestTimePolicy(ttt="bn", anchors="yes")  # type: ignore[arg-type]


@pytest.mark.must
def test_calibration_refuses_anchors_where_noisy_class_ordered_streams_do_not_gain(
    anchored: Path, digits: Any, digits_export: Any
) -> None:
    """The tests' digits CNN, trained on crisp 8x8 digits, is one where the variance estimate does not hold:
    with its inputs denoised, class-ordered streams of noisy digits lost 0.6-2 points with the anchors' deep
    variances, and the calibration the pipeline runs (noisy validation images read class by class, a first
    batch's means left out: ``FIRST_MEANS``) refuses them. A model the engine cannot measure with (no
    input-noise record: nothing is restored, nothing read) gets none either."""
    anchors = SourceAnchors.select(digits.x_train, digits.y_train)
    assert anchors is not None
    held, labels = digits.x_test[:256], digits.y_test[:256]
    assert calibrate_anchors(anchored, anchors, held, labels) is False
    assert calibrate_anchors(digits_export.onnx_path, anchors, held, labels) is False


@pytest.mark.must
def test_evaluate_takes_the_anchors_by_default_and_no_anchors_turns_them_off(
    anchored: Path, digits: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluate --ttt bn`` on a model that records anchors measures a noisy class-ordered stream against
    them; ``--no-anchors`` does not, and the printed policy says which."""
    data = tmp_path / "noisy.npz"
    np.savez(data, x=corrupt(digits.x_test[256:576], "gaussian_noise", 4, seed=0), y=digits.y_test[256:576])
    base = ["evaluate", str(anchored), "--data", str(data), "--ttt", "bn", "--order", "class-sorted"]
    out = {}
    for flag in ("--anchors", "--no-anchors"):
        assert main([*base, flag, "--batch-size", "32", "--format", "json"]) == 0
        out[flag] = json.loads(capsys.readouterr().out)
    assert out["--anchors"]["policy"]["anchors"] is True and out["--no-anchors"]["policy"]["anchors"] is False
    assert out["--anchors"]["accuracy"] != out["--no-anchors"]["accuracy"]


@pytest.mark.smoke
def test_calibration_refuses_anchors_for_a_model_without_batchnorm(mlp_export: Any) -> None:
    """The pipeline's MLP and other BN-free networks adapt nothing: no anchors, and no error."""
    x = np.random.default_rng(0).standard_normal((64, 1, 8, 8)).astype(np.float32)
    anchors = SourceAnchors(x[:20], np.repeat(np.arange(10), 2))
    assert calibrate_anchors(mlp_export.onnx_path, anchors, x, np.arange(64) % 10) is False
