"""The memory statistics: the one-pass graph, the class-balanced memory, the blend, streams and callers,
and a fast check of the targets on a held-out severity (the full held-out proof: test_stream_proof.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from modelexport._numeric import softmax
from modelexport.errors import TestTimeError
from modelexport.testtime import POLICY_PRESETS, STATISTICS, BNAdapter, TestTimeEngine, TestTimePolicy
from modelexport.testtime.adapt import channel_stats
from modelexport.testtime.corruptions import corrupt
from modelexport.testtime.engine import MIN_STEM_WEIGHT
from modelexport.testtime.graph import (
    MIX_PREFIX,
    NCHWC_BLOCK,
    SAMPLE_STATS,
    mix_variance_gate,
    mix_weight,
    mixed_statistics,
)
from modelexport.testtime.memory import (
    BLUR_GATE,
    NOISE_GATE,
    SHUT_PRIOR,
    SUPPORT,
    StatisticsMemory,
    balanced_keep,
)
from modelexport.testtime.streams import CollapseGuard
from modelexport.testtime.tail import STEP_EXAMPLES
from tests.testtime.robustness import run_stream


@pytest.mark.must
def test_one_pass_reports_each_example_and_mixes_the_stem_exactly(digits_export: Any, digits: Any) -> None:
    """Weight 0: the source model, bit for bit in the BN statistics, and the graph without the mixing nodes
    the same; weight 1: the stem layer normalises with the batch's own statistics (train-mode BN); the
    per-example statistics are those of the BN inputs."""
    adapter = BNAdapter(digits_export.onnx_path)
    assert adapter.stem == [True, False, False] and adapter.mixed == [0]
    feeds = {"x": digits.x_test[:40]}
    source = adapter.run(feeds)[0]
    import onnxruntime as ort

    plain = ort.InferenceSession(str(digits_export.onnx_path)).run(None, feeds)[0]
    np.testing.assert_allclose(source, plain, rtol=1e-5, atol=1e-5)
    layers = adapter.layers
    out = adapter.run(
        feeds, {mix_weight(0): np.asarray(1.0, np.float32)}, [SAMPLE_STATS, *mixed_statistics(0), layers[0].x]
    )
    stats, mean, var, x0 = out[0].reshape(40, -1), out[1], out[2], out[3]
    want_mean, want_var = channel_stats(x0)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(var, want_var, rtol=1e-3, atol=1e-5)
    c = len(want_mean)
    np.testing.assert_allclose(stats[:, :c], x0.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
    s = stats.shape[1] // 2
    np.testing.assert_allclose(stats[:, s : s + c], (x0.astype(np.float64) ** 2).mean(axis=(2, 3)), rtol=1e-4)
    unmixed = adapter.run(feeds, None, list(mixed_statistics(0)))
    np.testing.assert_array_equal(unmixed[0], adapter.source_state[layers[0].mean])
    np.testing.assert_array_equal(unmixed[1], adapter.source_state[layers[0].var])
    # weight 0: the graph without the mixing nodes computes what the mixing graph does, in its own session
    state = adapter.statistics_feeds(None, None, 0.0, [0.5])
    assert adapter._unmixed_session is None and not adapter.mixes(state)
    output = adapter.output_names[0]
    logits, rows, _ = adapter.run_with_statistics(feeds, state, output)
    assert adapter._unmixed_session is not None
    mixing = adapter.session.run([output, SAMPLE_STATS], {**feeds, **state})
    np.testing.assert_array_equal(rows, mixing[1].reshape(40, -1))
    np.testing.assert_allclose(logits, mixing[0], rtol=1e-6, atol=1e-6)
    assert adapter.mixes(adapter.statistics_feeds(None, None, 0.1))


def _odd_stem_cnn() -> Any:
    """A stem of 8 channels (less than ONNX Runtime's NCHWc block), then 16."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    ).eval()


@pytest.mark.must
def test_channels_outside_the_blocked_layout_report_the_same_statistics(export_cache: Any) -> None:
    """A BN input whose channels do not fill ONNX Runtime's blocked layout squares with Pow and averages with
    ReduceMean (a Mul of two blocked tensors is computed blocked on padded channels and reordered back), a
    full block's with Mul and GlobalAveragePool: both report every example's statistics of the BN input, and
    the stem mixes the batch's own exactly."""
    export = export_cache.get("tt_odd_stem", _odd_stem_cnn, keep_batchnorm=True, input_shape=(1, 1, 12, 12))
    adapter = BNAdapter(export.onnx_path)
    ops = {n.output[0]: n.op_type for n in adapter.working_model.graph.node}
    assert 8 % NCHWC_BLOCK and not 16 % NCHWC_BLOCK
    assert ops[f"{MIX_PREFIX}0.square"] == "Pow" and ops[f"{MIX_PREFIX}1.square"] == "Mul"
    x = np.random.default_rng(0).standard_normal((40, 1, 12, 12)).astype(np.float32)
    layers = adapter.layers
    weight = {mix_weight(0): np.asarray(1.0, np.float32)}
    feeds = {adapter.source.graph.input[0].name: x}
    out = adapter.run(feeds, weight, [SAMPLE_STATS, *mixed_statistics(0), layers[0].x, layers[1].x])
    stats, mean, var, inputs = out[0].reshape(40, -1), out[1], out[2], out[3:]
    s, start = stats.shape[1] // 2, 0
    for t in inputs:
        c = t.shape[1]
        np.testing.assert_allclose(stats[:, start : start + c], t.mean(axis=(2, 3)), rtol=1e-5, atol=1e-6)
        squares = (t.astype(np.float64) ** 2).mean(axis=(2, 3))
        np.testing.assert_allclose(stats[:, s + start : s + start + c], squares, rtol=1e-4, atol=1e-6)
        start += c
    want_mean, want_var = channel_stats(inputs[0])
    np.testing.assert_allclose(mean, want_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(var, want_var, rtol=1e-3, atol=1e-5)


@pytest.mark.must
def test_the_memory_statistics_graph_reports_no_bn_inputs_and_predicts_the_same(
    digits_export: Any, digits: Any
) -> None:
    """The memory statistics read every example's statistics, not the BN inputs: their graph leaves those out
    (each kept ONNX Runtime's reorders to the plain layout) and predicts a stream bit for bit as the graph
    that reports them; the batch statistics, which read them, keep them."""
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    adapter = engine.adapter
    assert adapter is not None and not adapter.report_inputs
    outputs = {o.name for o in adapter.working_model.graph.output}
    assert outputs.isdisjoint(layer.x for layer in adapter.layers)
    with pytest.raises(TestTimeError, match="does not report the BN inputs"):
        adapter.batch_statistics({"x": digits.x_test[:8]})
    reporting = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    reporting.adapter = BNAdapter(digits_export.onnx_path)
    assert {layer.x for layer in reporting.adapter.layers} <= {
        o.name for o in reporting.adapter.working_model.graph.output
    }
    x = corrupt(digits.x_test[:160], "gaussian_noise", 3, seed=0)
    streams = engine.new_stream(), reporting.new_stream()
    for i in range(0, len(x), 32):
        feeds = {"x": x[i : i + 32]}
        np.testing.assert_array_equal(engine.predict(feeds, streams[0]), reporting.predict(feeds, streams[1]))
    batch = TestTimeEngine(digits_export.onnx_path, POLICY_PRESETS["bn-exact"]).adapter
    assert batch is not None and batch.report_inputs


@pytest.mark.must
def test_memory_keeps_every_class_its_share_and_the_newest() -> None:
    one_at_a_time, batched = StatisticsMemory(8, 2, 3), StatisticsMemory(8, 2, 3)
    labels = np.array([i % 3 for i in range(20)] + [0] * 10)  # three classes, then one class floods
    rows = np.arange(60, dtype=np.float64).reshape(30, 2)
    noise = rows[:, 0] / 100.0  # each example's excess noise and detail deficit travel with its entry
    deficit = rows[:, 1] / 200.0
    for row, label, level, lack in zip(rows, labels, noise, deficit, strict=True):
        one_at_a_time.add(row[None], np.array([label]), np.array([level]), np.array([lack]))
    batched.add(rows, labels, noise, deficit)
    for memory in (one_at_a_time, batched):
        counts = np.bincount(memory.classes[: memory.size], minlength=3)
        assert memory.size == 8 and sorted(counts) == [2, 3, 3] and memory.distinct == 3
        assert memory.coverage == 1.0
        np.testing.assert_allclose(memory.moments(), memory.stats[: memory.size].mean(axis=0))
        np.testing.assert_allclose(memory.noise[: memory.size], memory.stats[: memory.size, 0] / 100.0)
        assert memory.noise_level == pytest.approx(memory.stats[: memory.size, 0].mean() / 100.0)
        np.testing.assert_allclose(memory.deficit[: memory.size], memory.stats[: memory.size, 1] / 200.0)
        assert memory.deficit_level == pytest.approx(memory.stats[: memory.size, 1].mean() / 200.0)
        for c in range(3):  # the newest of each class are the ones kept
            kept = np.sort(memory.ages[: memory.size][memory.classes[: memory.size] == c])
            assert list(kept) == sorted(np.flatnonzero(labels == c) + 1)[-len(kept) :]
    np.testing.assert_array_equal(
        balanced_keep(np.array([0, 0, 0, 1]), np.array([1, 2, 3, 4]), 2), [2, 3]
    )  # class 1 keeps its one entry, class 0 its newest


def _replaced(labels: np.ndarray, ages: np.ndarray, label: int) -> int:
    """The entry a full memory drops for one example of ``label``, by its rule written out: the oldest of its
    own class where that class is among the largest, else the oldest of the largest classes' oldest."""
    counts = np.bincount(labels)
    largest = counts.max()
    if label < len(counts) and counts[label] == largest:
        victim = label
    else:
        victim = min((ages[labels == c].min(), c) for c in np.flatnonzero(counts == largest))[1]
    members = np.flatnonzero(labels == victim)
    return int(members[np.argmin(ages[members])])


@pytest.mark.must
@pytest.mark.parametrize(
    ("sizes", "runs", "seed"),
    [((2, 3, 16, 40), 12, 0), ((1, 1, 1, 2, 16), 40, 1)],
    ids=["batches", "singles"],
)
def test_the_memory_keeps_what_its_rules_keep(sizes: tuple[int, ...], runs: int, seed: int) -> None:
    """The memory finds what it keeps per class (the oldest of a class are dropped), without sorting its
    capacity, and takes one example at a time (how a batch-1 stream fills and runs it) with Python scalars:
    after every batch it must hold exactly what the rules keep -- of its entries and a batch what
    :func:`balanced_keep` picks, of a full memory and one example what :func:`_replaced` names -- with their
    moments and readings. Batches are mixed with runs of one class; ``singles`` mixes in examples."""
    rng = np.random.default_rng(seed)
    for _ in range(250):
        capacity, classes = int(rng.integers(1, 24)), int(rng.integers(1, 8))
        memory = StatisticsMemory(capacity, 2, classes)
        labels, ages, rows, clock = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 2)), 0
        for _ in range(int(rng.integers(1, runs))):
            n = int(rng.choice(sizes))
            batch = (
                rng.integers(0, classes, n) if rng.random() < 0.5 else np.full(n, rng.integers(0, classes))
            )
            new_rows = rng.standard_normal((n, 2))
            memory.add(new_rows, batch, new_rows[:, 1] ** 2, np.abs(new_rows[:, 0]))
            if n == 1 and len(labels) == capacity:
                j = _replaced(labels, ages, int(batch[0]))
                labels[j], ages[j], rows[j] = batch[0], clock + 1, new_rows[0]
            else:
                labels, rows = np.concatenate([labels, batch]), np.concatenate([rows, new_rows])
                ages = np.concatenate([ages, clock + 1 + np.arange(n)])
                if len(labels) > capacity:
                    keep = balanced_keep(labels, ages, capacity)
                    labels, ages, rows = labels[keep], ages[keep], rows[keep]
            clock += n
            held, order = np.argsort(memory.ages[: memory.size]), np.argsort(ages)
            np.testing.assert_array_equal(memory.ages[: memory.size][held], ages[order])
            np.testing.assert_array_equal(memory.classes[: memory.size][held], labels[order])
            np.testing.assert_allclose(memory.moments(), rows.mean(axis=0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(memory.noise_level, (rows[:, 1] ** 2).mean(), rtol=1e-12)
            np.testing.assert_allclose(memory.deficit_level, np.abs(rows[:, 0]).mean(), rtol=1e-12)
            assert memory.size == len(labels) and memory.distinct == len(np.unique(labels))
            fair = SUPPORT * capacity / classes
            held = np.minimum(1.0, np.unique(labels, return_counts=True)[1] / fair).sum()
            assert memory.support == pytest.approx(min(1.0, held / min(classes, capacity)), abs=1e-12)


@pytest.mark.must
def test_the_quota_of_a_few_classes_equals_the_vectorised_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from modelexport.testtime import memory

    rng = np.random.default_rng(0)
    cases = [(rng.integers(0, 30, int(rng.integers(1, 40))), int(rng.integers(1, 100))) for _ in range(2000)]
    cases = [(c, cap) for c, cap in cases if c.sum() > cap]
    small = [memory._water_level(c.tolist(), cap) for c, cap in cases]
    monkeypatch.setattr(memory, "SMALL_CLASSES", -1)  # every case through the numpy path
    for (counts, capacity), got in zip(cases, small, strict=True):
        assert got == memory._water_level(counts.tolist(), capacity)
        assert sum(got) == capacity and (np.array(got) <= counts).all()


@pytest.mark.must
def test_the_entropy_of_a_few_classes_equals_the_vectorised_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import modelexport._numeric as numeric

    rng = np.random.default_rng(0)
    cases = [rng.integers(0, 40, int(rng.integers(1, numeric.SCALAR_CLASSES + 1))) for _ in range(2000)]
    cases = [c for c in cases if c.any()]
    small = [numeric.count_entropy(c) for c in cases]
    assert numeric.count_entropy(np.array([0, 7, 7, 0, 7])) == pytest.approx(np.log(3), rel=1e-15)
    assert numeric.count_entropy(np.array([0, 5, 0])) == 0.0
    monkeypatch.setattr(numeric, "SCALAR_CLASSES", -1)  # every case through the numpy path
    for counts, got in zip(cases, small, strict=True):
        assert got == pytest.approx(numeric.count_entropy(counts), rel=1e-12, abs=1e-15)


@pytest.mark.must
def test_blend_is_the_mixture_with_the_source_and_deep_layers_weigh_coverage(digits_export: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    prior = adapter.prior(8.0, 32.0)
    width = 2 * len(prior.mean)
    memory = StatisticsMemory(64, width, 10)
    rng = np.random.default_rng(0)
    means = rng.normal(size=(16, width // 2))
    rows = np.concatenate([means, means**2 + rng.random((16, width // 2))], axis=1)  # mean squares >= means^2
    memory.add(rows, np.array([0, 1] * 8))  # 16 examples of 2 of 10 classes
    mean, var = prior.blend(memory)
    m, q = memory.moments()[: len(prior.mean)], memory.moments()[len(prior.mean) :]
    stem = adapter.channels[0]
    for part, count, strength in ((stem, 16, 8.0), (adapter.channels[1], 16 * 0.2**2, 32.0)):
        w = count / (count + strength)
        src_m, src_v = prior.mean[part], prior.var[part]
        want_mean = (1 - w) * src_m + w * m[part]
        want_var = (1 - w) * (src_v + src_m**2) + w * q[part] - want_mean**2
        np.testing.assert_allclose(mean[part], want_mean, rtol=1e-10)
        np.testing.assert_allclose(var[part], want_var, rtol=1e-10)


def _damped(opened: float) -> float:
    """The deep layers' coverage factor on a class-ordered stream at the given openness: the source counts
    ``1 + (SHUT_PRIOR - 1) * (1 - opened)`` times, the coverage enters squared."""
    return 1.0 / np.sqrt(1.0 + (SHUT_PRIOR - 1.0) * (1.0 - opened))


def _class_sorted_memory(prior: Any, s: int, measured: bool = True) -> tuple[StatisticsMemory, np.ndarray]:
    """Four classes seen (30 entries each) and five strays (one mispredicted entry each); ``measured``: with
    readings of a restoration that took nothing out (a clean stream of a model with its source's record)."""
    rng = np.random.default_rng(0)
    labels = np.array([0] * 30 + [1] * 30 + [2] * 30 + [3] * 30 + [4, 5, 6, 7, 8])
    means = prior.mean + rng.normal(size=(len(labels), s)) * np.sqrt(prior.var)
    memory = StatisticsMemory(128, 2 * s, 10)
    readings = np.zeros(len(labels)) if measured else None
    memory.add(np.concatenate([means, means**2 + prior.var], axis=1), labels, readings, readings)
    return memory, labels


@pytest.mark.must
def test_stray_predictions_count_as_classes_only_by_their_support_on_a_class_ordered_stream(
    digits_export: Any,
) -> None:
    """A class-sorted stream's memory: four classes seen (30 entries each) and five strays (one mispredicted
    entry each, which the balanced memory keeps). Counted plainly it covers nine classes of ten and the deep
    layers would follow it almost fully; counted by support (a class covered once it holds half its fair share,
    6.4 of 128 entries over 10 classes) it covers 4.8 -- what the deep layers weigh it by while the stream's
    labels arrive correlated and the stem's gate is shut, with the source counting ``SHUT_PRIOR`` times (the
    coverage halved) where the inputs' restoration reports what it took out (nothing here). An uncorrelated
    stream (uneven predictions of an i.i.d. one) keeps the plain count, the source still counting
    ``SHUT_PRIOR`` times while nothing measures a shift; an open gate (a measured shift) or no gate keep the
    plain count and the source's strength; a memory without those readings (a model without its source's
    record, whose shut gate may hide a shift the stem barely sees) keeps the source's strength."""
    adapter = BNAdapter(digits_export.onnx_path)
    prior, ungated = adapter.prior(16.0, 64.0, gate=0.1), adapter.prior(16.0, 64.0)
    s = len(prior.mean)
    memory, labels = _class_sorted_memory(prior, s)
    assert memory.coverage == pytest.approx(0.9)
    assert memory.support == pytest.approx((4 + 5 / 6.4) / 10)
    assert prior.coverage(memory, [0.0]) == pytest.approx(memory.support / 2)
    assert prior.coverage(memory, [1.0]) == memory.coverage
    assert prior.coverage(memory, [0.5]) == pytest.approx(
        (memory.coverage + memory.support) / 2 * _damped(0.5)
    )
    assert prior.coverage(memory, [0.0], correlated=False) == pytest.approx(memory.coverage / 2)
    assert prior.coverage(memory, [1.0], correlated=False) == memory.coverage
    assert ungated.coverage(memory, None) == memory.coverage
    unmeasured, _ = _class_sorted_memory(prior, s, measured=False)
    assert not unmeasured.measured and prior.coverage(unmeasured, [0.0]) == pytest.approx(memory.support)
    assert prior.coverage(unmeasured, [0.0], correlated=False) == unmeasured.coverage
    deep = slice(adapter.channels[1].start, s)
    m = memory.moments()[:s]
    for coverage, gates in ((memory.support / 2, [0.0]), (memory.coverage, [1.0])):
        count = len(labels) * coverage**2
        w = count / (count + 64.0)
        mean, _ = prior.blend(memory, gates)
        np.testing.assert_allclose(
            mean[deep], prior.mean[deep] + w * (m[deep] - prior.mean[deep]), rtol=1e-10
        )


@pytest.mark.must
def test_the_detail_the_sharpening_gave_back_releases_the_deep_layers_source(digits_export: Any) -> None:
    """A blurred stream whose sharpening left the stem's statistics at the source's: its entries' detail
    deficit as given gives the deep layers back the source's own strength as it rises from ``BLUR_GATE`` to
    twice that, and leaves the gates (the plain count, the stem's variances) as they are."""
    adapter = BNAdapter(digits_export.onnx_path)
    prior = adapter.prior(16.0, 64.0, gate=0.1)
    s = len(prior.mean)
    plain, _ = _class_sorted_memory(prior, s)
    for level, released in ((0.0, 0.0), (BLUR_GATE, 0.0), (1.5 * BLUR_GATE, 0.5), (2 * BLUR_GATE, 1.0)):
        memory = StatisticsMemory(128, 2 * s, 10)
        memory.add(plain.stats[: plain.size], plain.classes[: plain.size], None, np.full(plain.size, level))
        assert memory.deficit_level == pytest.approx(level)
        assert prior.gates(memory) == prior.gates(plain)  # the gates do not read it
        assert prior.coverage(memory, [0.0]) == pytest.approx(memory.support * _damped(released))


@pytest.mark.must
def test_the_label_history_tells_a_class_ordered_stream_from_an_uneven_iid_one() -> None:
    """Correlated: the last 64 predictions fail the G-test against the ones before them. A class-sorted
    stream is (one class at a time), from its first predictions on (uniform before any history); an i.i.d.
    stream is not, balanced or collapsed onto three classes (a corruption's uneven predictions)."""
    from modelexport.testtime.streams import LabelHistory, chi2_critical, label_shift_statistic

    rng = np.random.default_rng(0)
    streams = {
        "class-sorted": np.repeat(np.arange(10), 60),
        "iid": rng.integers(0, 10, 600),
        "collapsed iid": rng.choice(10, 600, p=[0.3, 0.3, 0.3] + [0.1 / 7] * 7),
    }
    verdicts: dict[str, list[bool]] = {}
    for name, classes in streams.items():
        for batch in (1, 40):
            history = LabelHistory()
            seen = []
            for i in range(0, len(classes), batch):
                history.push(classes[i : i + batch])
                seen.append(history.correlated(10))
            verdicts[f"{name}, batch {batch}"] = seen
    for total in (1, 63, 64, 65, 575, 576, 577, 640, 1152, 1300):  # the ring read back in order
        classes = rng.integers(0, 10, total)
        history = LabelHistory()
        for i in range(0, total, 7):
            history.push(classes[i : i + 7])
        last = classes[-576:]
        recent = min(len(last), 64)
        g = label_shift_statistic(
            last[len(last) - recent :].tolist(), last[: len(last) - recent].tolist(), 10
        )
        assert history.correlated(10) == (g > chi2_critical(9, 0.001)), total
    for batch in (1, 40):
        assert all(verdicts[f"class-sorted, batch {batch}"][64 // batch :]), batch
        for name in ("iid", "collapsed iid"):  # one test per batch, 64 predictions each: a few false alarms
            assert np.mean(verdicts[f"{name}, batch {batch}"][300 // batch :]) <= 0.1, (name, batch)


@pytest.mark.must
def test_the_shift_gate_keeps_the_stem_variances_until_the_memory_moves_away(
    digits_export: Any, digits: Any
) -> None:
    """The gate measures the variance part of KL(memory || source) per stem channel: a memory drawn with the
    source's own variances keeps it shut (the stem's variances stay the source's, its means blend as before;
    on an i.i.d. stream the deep layers blend as before where the memory has no restoration's readings, and
    nearer the source where they say nothing was taken out: no shift is measured); one whose stem variance
    dropped to a fifth (a contrast loss) opens it fully.
    In the graph, the variance gate input at 0 mixes the batch into the mean only."""
    adapter = BNAdapter(digits_export.onnx_path)
    prior, ungated = adapter.prior(16.0, 64.0, gate=0.1), adapter.prior(16.0, 64.0)
    stem, s = adapter.channels[0], len(prior.mean)
    assert prior.gated == [stem] and ungated.gated == []
    rng = np.random.default_rng(0)

    def memory(var_scale: float) -> StatisticsMemory:
        var = prior.var.copy()
        var[stem] *= var_scale
        means = prior.mean + 0.5 * np.sqrt(prior.var) + rng.normal(size=(128, s)) * np.sqrt(var) * 0.3
        squares = means**2 + var * (1 - 0.09)  # pooled variance: var (between examples 9%, within the rest)
        bank = StatisticsMemory(128, 2 * s, 10)
        bank.add(np.concatenate([means, squares], axis=1), np.arange(128) % 10, np.zeros(128))  # measured
        return bank

    clean, shifted = memory(1.0), memory(0.2)
    assert prior.shift(clean)[0] < 0.02 and prior.gates(clean) == [0.0]
    assert prior.shift(shifted)[0] > 0.3 and prior.gates(shifted) == [1.0]
    mean, var = prior.blend(clean, prior.gates(clean), correlated=False)  # an i.i.d. stream
    free_mean, free_var = ungated.blend(clean)
    np.testing.assert_allclose(var[stem], prior.var[stem], rtol=1e-12)  # shut: the source's variances
    assert not np.allclose(mean[stem], prior.mean[stem])  # the means follow the memory
    np.testing.assert_allclose(mean[stem], free_mean[stem], rtol=1e-12)
    deep = slice(stem.stop, s)
    # measured, nothing taken out, no shift: the deep layers' source counts SHUT_PRIOR times
    assert np.abs(mean[deep] - prior.mean[deep]).sum() < np.abs(free_mean[deep] - prior.mean[deep]).sum()
    # the same entries without readings: deep layers as without a gate
    bare = StatisticsMemory(128, 2 * s, 10)
    bare.add(clean.stats[: clean.size], clean.classes[: clean.size])
    bare_mean, bare_var = prior.blend(bare, prior.gates(bare), correlated=False)
    np.testing.assert_allclose(bare_mean, free_mean, rtol=1e-12)
    np.testing.assert_allclose(bare_var[stem.stop :], free_var[stem.stop :], rtol=1e-9)
    ordered = prior.blend(clean, prior.gates(clean))[0]  # a class-ordered one: deep layers nearer the source
    assert np.abs(ordered[deep] - prior.mean[deep]).sum() < np.abs(free_mean[deep] - prior.mean[deep]).sum()
    opened = prior.blend(shifted, prior.gates(shifted))
    np.testing.assert_allclose(opened[1], ungated.blend(shifted)[1], rtol=1e-9)
    feeds = {"x": digits.x_test[:40], mix_weight(0): np.asarray(1.0, np.float32)}
    both = adapter.run(feeds, None, list(mixed_statistics(0)))
    mean_only = adapter.run(
        {**feeds, mix_variance_gate(0): np.asarray(0.0, np.float32)}, None, list(mixed_statistics(0))
    )
    np.testing.assert_allclose(mean_only[0], both[0], rtol=1e-6)  # the batch's mean
    np.testing.assert_array_equal(mean_only[1], adapter.source_state[adapter.layers[0].var])


@pytest.mark.must
def test_the_input_noise_the_denoising_took_out_opens_the_gates(digits_export: Any) -> None:
    """A noisy stream whose input denoising left the stem's variances at the source's (the stem's own gate
    shut) still shifts the deep layers: the entries' excess noise as given opens the gates from
    ``NOISE_GATE`` (shut) to twice that (open), whichever of the two is more open; a stream without the
    reading (a model with no record) keeps the stem's gate."""
    adapter = BNAdapter(digits_export.onnx_path)
    prior = adapter.prior(16.0, 64.0, gate=0.1)
    s = len(prior.mean)
    rows = np.tile(np.concatenate([prior.mean, prior.var + prior.mean**2]), (128, 1))  # the source's moments
    for level, opened in ((None, 0.0), (NOISE_GATE, 0.0), (1.5 * NOISE_GATE, 0.5), (2 * NOISE_GATE, 1.0)):
        memory = StatisticsMemory(128, 2 * s, 10)
        memory.add(rows, np.arange(128) % 10, None if level is None else np.full(128, level))
        assert prior.shift(memory)[0] < 1e-6
        assert prior.gates(memory) == pytest.approx([opened])


@pytest.mark.must
def test_a_streams_first_batch_measures_its_own_shift(digits_export: Any, digits: Any) -> None:
    """A stream's first batch has no memory to measure a shift on: its stem variances stay the source's while
    the batch's own statistics are within the gate (one class of clean digits, as a class-sorted stream
    begins), and follow the batch where they are not (a contrast loss; the gates as a memory of that batch
    would read them, its excess noise aside), and the adapted model shipped for it predicts the same.
    ``shift_gate=0`` keeps the old first batch: the batch's own."""
    import onnxruntime as ort

    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    adapter, prior = engine.adapter, engine._prior
    assert adapter is not None and prior is not None and prior.gated == [adapter.channels[0]]
    one_class = digits.x_test[digits.y_test == 3][:40]
    contrast = corrupt(digits.x_test[:40], "contrast", 4, seed=0)

    def served(x: np.ndarray, gate: float) -> np.ndarray:
        feeds = {"x": x, mix_weight(0): np.asarray(40 / (40 + 16), np.float32)}
        feeds[mix_variance_gate(0)] = np.asarray(gate, np.float32)
        return softmax(adapter.run(feeds, None, [engine.output_name])[0], -1)

    for x, gate in ((one_class, 0.0), (contrast, 1.0)):
        rows = adapter.run({"x": x}, None, [SAMPLE_STATS])[0].reshape(len(x), -1)
        assert prior.first_gates(rows) == [gate]
        memory = StatisticsMemory(128, rows.shape[1], 10)
        memory.add(rows, np.arange(len(x)) % 10, np.full(len(x), 4 * NOISE_GATE))  # noisy, as read
        assert prior.shift(rows) == pytest.approx(prior.shift(memory))  # rows or a memory of them: one shift
        assert prior.gates(memory) == [1.0]  # a memory's gates read the noise; the first batch's do not
        first = engine.predict({"x": x}, engine.new_stream())
        np.testing.assert_allclose(first, served(x, gate), rtol=1e-5, atol=1e-6)
        shipped = ort.InferenceSession(engine.adapted_model({"x": x}).SerializeToString())
        np.testing.assert_allclose(softmax(shipped.run(None, {"x": x})[0], -1), first, rtol=1e-4, atol=1e-5)
    ungated = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn", shift_gate=0.0))
    np.testing.assert_allclose(
        ungated.predict({"x": one_class}), served(one_class, 1.0), rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(served(one_class, 0.0), served(one_class, 1.0), atol=1e-3)


@pytest.mark.must
def test_a_class_ordered_batch_counts_in_the_stem_as_far_as_the_stem_sees_a_shift(
    digits_export: Any, digits: Any
) -> None:
    """The stem mixes the batch's own statistics into the memory's fully where the stream's labels do not
    arrive correlated in time, and on a correlated stream only as far as the stem's own shift opens its gate:
    a class-sorted batch of clean digits is one class, whose stem signature its own statistics would
    normalise away, so the memory and the source set the stem there (its means still follow the memory);
    under a contrast loss the stem sees the shift and each batch reads it afresh, as before. A batch smaller
    than ``MIN_BATCH`` keeps its weight, unless it is below ``MIN_STEM_WEIGHT`` (one example: 1 / 145)."""
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    prior = engine._prior
    assert engine.adapter is not None and prior is not None
    weight, mean = mix_weight(0), engine.adapter.layers[0].mean
    x, y = digits.x_test[:320], digits.y_test[:320]
    contrast = corrupt(x, "contrast", 4, seed=0)
    for data, order, correlated, share in (
        (x, "class-sorted", True, 0.0),
        (contrast, "class-sorted", True, 1.0),
        (x, "shuffle", False, 1.0),  # the batch counts fully whatever the stem sees
    ):
        _, stream = run_stream(engine, engine.policy, data, y, order, 40)
        assert stream.bank is not None and stream.labels is not None  # type: ignore[attr-defined]
        bank = stream.bank  # type: ignore[attr-defined]
        assert stream.labels.correlated(10) is correlated  # type: ignore[attr-defined]
        assert prior.first_gates(bank) == [share if correlated else 0.0]  # clean: no shift
        state = engine._statistics(stream, 40)  # type: ignore[arg-type]
        assert float(state.get(weight, 0.0)) == pytest.approx(
            share * 40 / (40 + bank.size + engine.policy.stem_prior)
        )
        blended = prior.blend(bank, prior.gates(bank), correlated)[0]
        np.testing.assert_allclose(state[mean], blended[engine.adapter.channels[0]], rtol=1e-6)
        assert not np.allclose(state[mean], engine.adapter.source_state[mean], atol=1e-3)
    # below MIN_BATCH a batch keeps its weight (12 examples: 12 / 156 beside a full memory) ...
    _, stream = run_stream(engine, engine.policy, x, y, "class-sorted", 12)
    assert stream.labels.correlated(10) and prior.first_gates(stream.bank) == [0.0]  # type: ignore[attr-defined]
    state = engine._statistics(stream, 12)  # type: ignore[arg-type]
    assert float(state.get(weight, 0.0)) == pytest.approx(12 / (12 + 128 + engine.policy.stem_prior))
    # ... down to MIN_STEM_WEIGHT: one example (1 / 145) weighs nothing
    assert (
        1 / (1 + 128 + engine.policy.stem_prior)
        < MIN_STEM_WEIGHT
        < 12 / (12 + 128 + engine.policy.stem_prior)
    )
    _, stream = run_stream(engine, engine.policy, x, y, "class-sorted", 1)
    state = engine._statistics(stream, 1)  # type: ignore[arg-type]
    assert weight not in state and not engine.adapter.mixes(state)


@pytest.mark.sanity
def test_the_default_stem_keeps_its_variances_on_clean_digits_and_adapts_them_to_contrast(
    digits_export: Any, digits: Any
) -> None:
    """Along a class-sorted stream of the trained digits CNN, the default policy's stem BN layer (adapted
    model of the next batch) keeps the source variances on clean digits (their stem variances are within 0.1
    nats a channel of the source's) while its means follow the stream, and moves its variances to the
    corrupted data's under a contrast loss; without the gate (``shift_gate=0``) they move on clean digits too."""
    path, y = digits_export.onnx_path, digits.y_test
    layer = BNAdapter(path).layers[0]
    source = BNAdapter(path).source_state

    def stem(policy: TestTimePolicy, x: np.ndarray) -> dict[str, np.ndarray]:
        engine = TestTimeEngine(path, policy)
        _, stream = run_stream(engine, policy, x, y, "class-sorted", 32)
        adapted = engine.adapted_model({"x": x[:32]}, stream)  # type: ignore[arg-type]
        return BNAdapter(adapted).source_state

    contrast = corrupt(digits.x_test, "contrast", 3, seed=0)
    clean = stem(TestTimePolicy(ttt="bn"), digits.x_test)
    np.testing.assert_allclose(clean[layer.var], source[layer.var], rtol=1e-6)
    assert not np.allclose(clean[layer.mean], source[layer.mean], rtol=1e-3)
    ungated = stem(TestTimePolicy(ttt="bn", shift_gate=0.0), digits.x_test)
    assert not np.allclose(ungated[layer.var], source[layer.var], rtol=1e-2)
    assert np.median(stem(TestTimePolicy(ttt="bn"), contrast)[layer.var] / source[layer.var]) < 0.5


@pytest.mark.must
def test_streams_are_per_caller_and_a_call_without_one_keeps_nothing(digits_export: Any, digits: Any) -> None:
    """Four callers stream their own batches through one engine at once: each gets what it gets alone."""
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    batches = [corrupt(digits.x_test[i * 24 : (i + 1) * 24], "contrast", 1 + i % 4) for i in range(16)]
    clients = [batches[k::4] for k in range(4)]

    def serve(client: list[np.ndarray]) -> list[np.ndarray]:
        stream = engine.new_stream()
        return [engine.predict({"x": b}, stream) for b in client]

    alone = [serve(c) for c in clients]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(serve, clients))
    for a, t in zip(alone, together, strict=True):
        for x, y in zip(a, t, strict=True):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
    stream = engine.new_stream()
    first = engine.predict({"x": batches[0]}, stream)
    engine.predict({"x": batches[1]}, stream)
    assert stream.bank is not None and stream.bank.size == 48 and stream.batches == 2
    np.testing.assert_allclose(engine.predict({"x": batches[0]}), first, rtol=1e-6)  # no stream: fresh
    assert not np.allclose(engine.predict({"x": batches[0]}, stream), first)  # the stream remembers


@pytest.mark.must
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"statistics": "running"}, "valid: memory, batch"),
        ({"memory_size": 0}, "memory_size"),
        ({"stem_prior": -1.0}, "stem_prior"),
        ({"deep_prior": float("inf")}, "deep_prior"),
        ({"shift_gate": -0.1}, "shift_gate"),
        ({"momentum": 0.5}, "--statistics batch"),
        ({"bn_prior": 16.0}, "--statistics batch"),
    ],
)
def test_memory_options_are_checked(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TestTimeError) as info:
        TestTimePolicy(ttt="bn", **changes)
    assert message in str(info.value) + str(info.value.hint)


@pytest.mark.must
def test_policies_stored_before_the_memory_keep_their_meaning() -> None:
    old = TestTimePolicy(ttt="bn", statistics="batch", episodic=True).to_dict()
    del old["statistics"], old["memory_size"], old["stem_prior"], old["deep_prior"]
    assert TestTimePolicy.from_dict(old) == POLICY_PRESETS["bn-exact"]
    assert TestTimePolicy.from_dict({"ttt": "bn"}).statistics == "memory"  # a hand-written subset: defaults
    assert TestTimePolicy(ttt="bn").continual and not TestTimePolicy().continual


@pytest.mark.must
def test_lazy_guard_runs_the_source_only_when_predictions_look_collapsed() -> None:
    spread, one = np.arange(64) % 10, np.zeros(64, np.int64)
    guard = CollapseGuard(threshold=0.2, window=128, shift_alpha=0.0)
    assert not any(guard.suspects(spread, 10) for _ in range(8))  # diverse: never asks for the source
    assert not guard.suspects(one, 10)  # the window is not yet narrow
    assert guard.suspects(one, 10)  # now it is
    assert guard.judge(one, spread, 10) is True and guard.resets == 1  # the source spreads: collapsed
    both = CollapseGuard(threshold=0.2, window=128, shift_alpha=0.0)
    for _ in range(2):
        both.suspects(one, 10)
    assert both.judge(one, one, 10) is False  # the source is as narrow (a corruption): no reset
    assert not both.suspects(one, 10)  # and the next look is a window later
    assert both.recent is not None and both.recent.backoff == 2  # then twice as far apart, up to 8x


@pytest.mark.sanity
def test_a_collapsing_stream_is_reset_and_served_by_the_source(digits_export: Any, digits: Any) -> None:
    """Tent with a wild learning rate on every BN layer collapses a continual stream (the test set four
    times: a step per STEP_EXAMPLES); the lazy guard resets it."""
    x, y, path = (
        np.concatenate([digits.x_test] * 4),
        np.concatenate([digits.y_test] * 4),
        digits_export.onnx_path,
    )
    wild = TestTimePolicy(ttt="tent", learning_rate=1.0, ttt_iterations=3, collapse_window=64, step_layers=0)
    unguarded, _ = run_stream(path, wild.with_changes(collapse_threshold=0.0), x, y, "shuffle", 32)
    guarded, stream = run_stream(path, wild, x, y, "shuffle", 32)
    assert stream.resets >= 1 and stream.fallbacks >= 1  # type: ignore[attr-defined]
    assert guarded > unguarded + 0.1


@pytest.mark.sanity
@pytest.mark.parametrize("method", ["tent", "sar"])
def test_gradient_methods_step_only_on_batches_they_can_learn_from(
    digits_export: Any, digits: Any, method: str
) -> None:
    """One example's entropy is minimised by any confident class: below MIN_BATCH the gradient methods are
    BN's statistics alone. Batches of MIN_BATCH or more are gathered and stepped on once STEP_EXAMPLES are in;
    the step serves the next batches."""
    x = corrupt(digits.x_test[:24], "contrast", 3)
    bn, tent = (TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt=t)) for t in ("bn", method))
    streams = [e.new_stream() for e in (bn, tent)]
    for i in range(len(x)):
        a, b = (e.predict({"x": x[i : i + 1]}, s) for e, s in zip((bn, tent), streams, strict=True))
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert streams[1].state is None and streams[1].tail is None  # nothing learned, nothing gathered
    seen = 0
    while seen + len(x) < STEP_EXAMPLES:
        a, b = (e.predict({"x": x}, s) for e, s in zip((bn, tent), streams, strict=True))
        np.testing.assert_allclose(a, b, rtol=1e-6)  # gathered, not yet stepped on
        seen += len(x)
    assert streams[1].state is None and streams[1].tail.examples == seen  # type: ignore[union-attr]
    tent.predict({"x": x}, streams[1])
    assert streams[1].state is not None and streams[1].tail.examples == 0  # type: ignore[union-attr]
    assert not np.allclose(bn.predict({"x": x}, streams[0]), tent.predict({"x": x}, streams[1]))


@pytest.mark.smoke
def test_memory_bn_meets_the_targets_on_a_held_out_severity(digits_export: Any, digits: Any) -> None:
    """Fast check on contrast@4 (tuning used severity 3): class-sorted batches of 64 recover >= 50% of the
    loss, batch 1 >= 30%, and clean class-sorted and Dirichlet streams lose at most a point."""
    x, y, path = digits.x_test, digits.y_test, digits_export.onnx_path
    shifted = corrupt(x, "contrast", 4)
    plain = TestTimeEngine(path)
    engine = TestTimeEngine(path, TestTimePolicy(ttt="bn"))
    clean_plain = run_stream(plain, plain.policy, x, y, "as-is", 64)[0]
    shifted_plain = run_stream(plain, plain.policy, shifted, y, "as-is", 64)[0]
    lost = clean_plain - shifted_plain
    assert lost > 0.5
    for batch, target in ((64, 0.5), (1, 0.3)):
        acc = run_stream(engine, engine.policy, shifted, y, "class-sorted", batch)[0]
        assert (acc - shifted_plain) / lost >= target, (batch, acc)
        for order in ("class-sorted", "dirichlet:0.03"):
            assert run_stream(engine, engine.policy, x, y, order, batch)[0] >= clean_plain - 0.01


@pytest.mark.sanity
@pytest.mark.parametrize("statistics", list(STATISTICS))
def test_every_statistics_source_adapts_a_shifted_batch(
    digits_export: Any, digits: Any, statistics: str
) -> None:
    x = corrupt(digits.x_test[:64], "contrast", 3)
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn", statistics=statistics))
    plain = TestTimeEngine(digits_export.onnx_path).predict({"x": x}).argmax(1)
    adapted = engine.predict({"x": x}, engine.new_stream()).argmax(1)
    y = digits.y_test[:64]
    assert (adapted == y).mean() > (plain == y).mean() + 0.5
