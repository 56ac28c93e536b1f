"""TTA transforms: every registry entry is tested (shape, seeding, invertibility); hand-made checks for some."""

from __future__ import annotations

import numpy as np
import pytest

from modelexport.errors import TestTimeError
from modelexport.testtime.augment import (
    TRANSFORMS,
    get_transform,
    make_views,
    resize_bilinear,
    transforms_for,
)

ALL = list(TRANSFORMS)
ARRAY = [k for k in ALL if not k.startswith("text:")]
TEXTS = ["the quick brown fox jumps over the lazy dog", "Hello World", "one"]


def _batch(modality: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = (3, 2, 6, 6) if modality == "image" else (5, 7)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.sanity
@pytest.mark.parametrize("key", ARRAY)
def test_array_views_keep_shape_and_dtype(key: str) -> None:
    t = TRANSFORMS.get(key)
    x = _batch(t.modality)
    views = t.views(x, np.random.default_rng(0))
    assert views, key
    for v in views:
        assert v.shape == x.shape and v.dtype == x.dtype


@pytest.mark.must
@pytest.mark.parametrize("key", [k for k in ARRAY if TRANSFORMS.get(k).invertible])
def test_deaugment_of_augment_is_identity(key: str) -> None:
    t = TRANSFORMS.get(key)
    x = _batch(t.modality)
    for i, v in enumerate(t.views(x, np.random.default_rng(0))):
        np.testing.assert_array_equal(t.invert(v, i), x)


@pytest.mark.must
@pytest.mark.parametrize("key", ALL)
def test_same_seed_same_views(key: str) -> None:
    t = TRANSFORMS.get(key)
    x = TEXTS if t.modality == "text" else _batch(t.modality)
    a = t.views(x, np.random.default_rng(7))
    b = t.views(x, np.random.default_rng(7))
    for va, vb in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb))


@pytest.mark.sanity
@pytest.mark.parametrize("key", [k for k in ALL if TRANSFORMS.get(k).random])
def test_random_transforms_change_with_the_seed(key: str) -> None:
    t = TRANSFORMS.get(key)
    x = [" ".join(f"w{i}" for i in range(30))] * 4 if t.modality == "text" else _batch(t.modality)
    a = t.views(x, np.random.default_rng(1))[0]
    b = t.views(x, np.random.default_rng(2))[0]
    assert not np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.sanity
@pytest.mark.parametrize("key", [k for k in ALL if k.startswith("text:")])
def test_text_views_keep_one_string_per_input(key: str) -> None:
    for view in TRANSFORMS.get(key).views(TEXTS, np.random.default_rng(0)):
        assert len(view) == len(TEXTS) and all(isinstance(s, str) and s for s in view)


@pytest.mark.sanity
def test_hand_made_image_transforms() -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)  # [[0, 1], [2, 3]]
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(get_transform("hflip", "image").views(x, rng)[0][0, 0], [[1, 0], [3, 2]])
    np.testing.assert_array_equal(get_transform("vflip", "image").views(x, rng)[0][0, 0], [[2, 3], [0, 1]])
    np.testing.assert_array_equal(get_transform("rot90", "image").views(x, rng)[0][0, 0], [[1, 3], [0, 2]])
    np.testing.assert_array_equal(get_transform("rot180", "image").views(x, rng)[0][0, 0], [[3, 2], [1, 0]])
    assert len(get_transform("five_crop", "image").views(_batch("image"), rng)) == 5
    assert len(get_transform("ten_crop", "image").views(_batch("image"), rng)) == 10
    bright = get_transform("brightness", "image").views(x, rng)
    np.testing.assert_allclose(bright[0] - x, 0.3, rtol=1e-6)  # +10% of the value range (3)
    np.testing.assert_allclose(x - bright[1], 0.3, rtol=1e-6)


@pytest.mark.sanity
def test_hand_made_text_transforms() -> None:
    rng = np.random.default_rng(0)
    assert get_transform("upper", "text").views(["a b"], rng) == [["A B"]]
    assert get_transform("truncate_tail", "text").views(["a b c d e"], rng) == [["a b c d"]]
    assert get_transform("truncate_head", "text").views(["a b c d e"], rng) == [["b c d e"]]
    swapped = get_transform("word_swap", "text").views(["a b c"], rng)[0][0].split()
    assert sorted(swapped) == ["a", "b", "c"] and swapped != ["a", "b", "c"]


@pytest.mark.sanity
def test_resize_bilinear_keeps_constant_images_and_matches_torch() -> None:
    import torch

    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(x), size=(9, 4), mode="bilinear", align_corners=False
    )
    np.testing.assert_allclose(resize_bilinear(x, 9, 4), ref.numpy(), atol=1e-5)


@pytest.mark.must
def test_unknown_transform_lists_the_valid_ones() -> None:
    with pytest.raises(TestTimeError, match="valid: identity, hflip"):
        make_views(_batch("image"), ["identity", "mirror"], "image")


@pytest.mark.sanity
def test_make_views_concatenates_in_order() -> None:
    views, owners, index = make_views(_batch("image"), ["identity", "five_crop"], "image")
    assert len(views) == 6 and [t.name for t in owners] == ["identity"] + ["five_crop"] * 5
    assert index == [0, 0, 1, 2, 3, 4]
    assert set(transforms_for("tensor")) == {"identity", "gaussian_noise", "feature_dropout"}


@pytest.mark.sanity
def test_rot90_needs_square_images() -> None:
    with pytest.raises(TestTimeError, match="square"):
        make_views(np.zeros((1, 1, 4, 6), np.float32), ["rot90"], "image")
