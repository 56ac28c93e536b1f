"""TestTimeEngine: batched TTA == sequential, dense de-augmentation, adaptive TTA counts, text TTA, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelexport.errors import InferenceError, TestTimeError
from modelexport.testtime import TestTimeEngine, TestTimePolicy

IMAGE_TTA = ("identity", "hflip", "scale", "brightness", "five_crop")


@pytest.mark.must
def test_batched_views_equal_sequential_views(digits_export: Any, digits_batch: dict) -> None:
    batched = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(tta_transforms=IMAGE_TTA)).run(
        digits_batch
    )
    sequential = TestTimeEngine(
        digits_export.onnx_path, TestTimePolicy(tta_transforms=IMAGE_TTA, batched=False)
    ).run(digits_batch)
    assert batched.batched and not sequential.batched and batched.n_views == 10
    np.testing.assert_allclose(batched.probs, sequential.probs, rtol=1e-5, atol=1e-6)


@pytest.mark.sanity
def test_identity_tta_equals_the_plain_run(digits_export: Any, digits_batch: dict) -> None:
    plain = TestTimeEngine(digits_export.onnx_path).predict(digits_batch)
    tta = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(tta_transforms="identity,identity")).predict(
        digits_batch
    )
    np.testing.assert_allclose(tta, plain, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.must
def test_dense_outputs_are_deaugmented_before_merging(segmenter_export: Any) -> None:
    """The 1x1-conv segmenter is flip/rotation equivariant: every de-augmented view equals the identity view."""
    x = {"x": np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)}
    invertible = ("identity", "hflip", "vflip", "rot90", "rot180", "rot270")
    engine = TestTimeEngine(
        segmenter_export.onnx_path, TestTimePolicy(tta_transforms=invertible, tta_aggregate="median")
    )
    views, k, _ = engine._views_logits(x, None)
    assert k == 6 and views.shape == (6, 2, 4, 6, 6)
    for v in views[1:]:
        np.testing.assert_allclose(v, views[0], rtol=1e-5, atol=1e-5)
    probs = engine.predict(x)
    np.testing.assert_allclose(
        probs, TestTimeEngine(segmenter_export.onnx_path).predict(x), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(TestTimeError, match="five_crop"):
        TestTimeEngine(
            segmenter_export.onnx_path, TestTimePolicy(tta_transforms="identity,five_crop")
        ).predict(x)


@pytest.mark.must
def test_adaptive_tta_augments_only_unconfident_rows(digits_export: Any, digits: Any) -> None:
    from modelexport.testtime.corruptions import corrupt

    feeds = {"x": corrupt(digits.x_test[:64], "blur", 3)}
    plain = TestTimeEngine(digits_export.onnx_path).predict(feeds)
    threshold = float(np.median(plain.max(axis=1)))
    policy = TestTimePolicy(tta_transforms="identity,scale,brightness", adaptive_threshold=threshold)
    result = TestTimeEngine(digits_export.onnx_path, policy).run(feeds)
    low = plain.max(axis=1) < threshold
    assert result.n_augmented == int(low.sum()) and 0 < result.n_augmented < 64
    np.testing.assert_allclose(result.probs[~low], plain[~low], rtol=1e-5)
    full = TestTimeEngine(digits_export.onnx_path, policy.with_changes(adaptive_threshold=None)).predict(
        feeds
    )
    np.testing.assert_allclose(result.probs[low], full[low], rtol=1e-5, atol=1e-6)
    assert (
        TestTimeEngine(digits_export.onnx_path, policy.with_changes(adaptive_threshold=1.0))
        .run(feeds)
        .n_augmented
        == 64
    )


@pytest.mark.sanity
def test_fixed_batch_models_fall_back_to_sequential_views(refiner_export: Any) -> None:
    rng = np.random.default_rng(0)
    feeds = {
        "state": rng.standard_normal((3, 6)).astype(np.float32),
        "context": rng.standard_normal((3, 6)).astype(np.float32),
    }
    engine = TestTimeEngine(
        refiner_export.onnx_path,
        TestTimePolicy(tta_transforms="identity,gaussian_noise,feature_dropout", seed=5),
    )
    assert not engine.dynamic_batch and engine.modality == "tensor"
    result = engine.run(feeds)
    assert not result.batched and result.n_views == 3
    np.testing.assert_array_equal(result.probs, engine.run(feeds).probs)  # seeded views


def _hash_features(texts: list[str]) -> dict[str, np.ndarray]:
    """A real (if tiny) featurizer: word counts hashed into the MLP's 6 inputs."""
    out = np.zeros((len(texts), 6), np.float32)
    for i, text in enumerate(texts):
        for word in text.split():
            out[i, sum(map(ord, word)) % 6] += 1.0
    return {"input": out}


@pytest.mark.sanity
def test_text_tta_augments_strings_then_featurizes(mlp_export: Any) -> None:
    texts = ["a fine film with a good cast", "Dull and Slow", "not bad at all"]
    plain = TestTimeEngine(mlp_export.onnx_path).predict(_hash_features(texts))
    identity = TestTimeEngine(
        mlp_export.onnx_path, TestTimePolicy(tta_transforms="identity", modality="text")
    )
    np.testing.assert_allclose(identity.predict_texts(texts, _hash_features), plain, rtol=1e-5)
    policy = TestTimePolicy(
        tta_transforms="identity,word_dropout,upper,truncate_tail", modality="text", seed=4
    )
    a = TestTimeEngine(mlp_export.onnx_path, policy).predict_texts(texts, _hash_features)
    b = TestTimeEngine(mlp_export.onnx_path, policy).predict_texts(texts, _hash_features)
    assert a.shape == (3, 3) and not np.allclose(a, plain)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TestTimeError, match="predict_texts"):
        TestTimeEngine(mlp_export.onnx_path, policy).predict(_hash_features(texts))


@pytest.mark.smoke
def test_everything_at_once(digits_export: Any, digits_batch: dict) -> None:
    policy = TestTimePolicy(tta_transforms="identity,scale", ttt="bn", mc_dropout=4, adaptive_threshold=0.99)
    result = TestTimeEngine(digits_export.onnx_path, policy).run(digits_batch)
    assert result.adapted and result.uncertainty is not None and result.probs.shape == (64, 10)
    np.testing.assert_allclose(result.probs.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.sanity
def test_missing_inputs_are_named(digits_export: Any) -> None:
    with pytest.raises(InferenceError, match="missing model inputs \\['x'\\]"):
        TestTimeEngine(digits_export.onnx_path).predict({"pixels": np.zeros((1, 1, 8, 8), np.float32)})


@pytest.mark.sanity
@pytest.mark.parametrize("ttt", ["none", "bn"])
def test_an_empty_batch_is_refused_with_a_typed_error(digits_export: Any, ttt: str) -> None:
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt=ttt))
    with pytest.raises(InferenceError, match="empty batch"):
        engine.predict({"x": np.zeros((0, 1, 8, 8), np.float32)})
