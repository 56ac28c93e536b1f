"""Dataset readers: every format, label mapping, stratified split, and errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelexport.data import BUILTINS, READERS, Dataset, load_dataset
from modelexport.errors import DatasetError

ROWS = [("a fine film", "pos"), ("dull and long", "neg"), ("great fun", "pos"), ("awful", "neg")]


def _write_csv(path: Path, rows: list[tuple[str, str]], header: str = "text,label", sep: str = ",") -> Path:
    path.write_text(
        header.replace(",", sep) + "\n" + "".join(f"{t}{sep}{y}\n" for t, y in rows), encoding="utf-8"
    )
    return path


def _write_images(root: Path, classes: dict[str, int], size: tuple[int, int] = (6, 5)) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            arr = rng.integers(0, 255, (size[1], size[0]), dtype=np.uint8)
            Image.fromarray(arr).save(root / name / f"{i}.png")
    return root


@pytest.mark.sanity
@pytest.mark.parametrize("suffix,sep", [(".csv", ","), (".tsv", "\t")])
def test_delimited_text(tmp_path: Path, suffix: str, sep: str) -> None:
    ds = load_dataset(_write_csv(tmp_path / f"d{suffix}", ROWS, sep=sep))
    assert ds.kind == "text" and len(ds) == 4
    assert ds.label_names == ["neg", "pos"] and ds.labels == [1, 0, 1, 0]
    assert ds.texts[0] == "a fine film" and ds.images is None and ds.x is None


@pytest.mark.sanity
def test_json_and_jsonl(tmp_path: Path) -> None:
    recs = [{"sentence": t, "target": y} for t, y in ROWS]
    (tmp_path / "d.json").write_text(json.dumps(recs))
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    for name in ("d.json", "d.jsonl"):
        ds = load_dataset(tmp_path / name)
        assert ds.texts == [t for t, _ in ROWS] and ds.label_names == ["neg", "pos"]


@pytest.mark.sanity
def test_named_columns_and_integer_labels_keep_numeric_order(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,body,stars\n1,good,10\n2,bad,2\n3,ok,10\n4,meh,2\n")
    ds = load_dataset(path, text_column="body", label_column="stars")
    assert ds.label_names == ["2", "10"] and ds.labels == [1, 0, 1, 0]


@pytest.mark.sanity
def test_image_folder_and_image_csv(tmp_path: Path) -> None:
    root = _write_images(tmp_path / "imgs", {"cat": 3, "dog": 2})
    ds = load_dataset(root)
    assert ds.kind == "image" and len(ds) == 5 and ds.label_names == ["cat", "dog"]
    assert ds.images[0].shape == (5, 6, 1) and ds.images[0].dtype == np.uint8
    csv_path = tmp_path / "imgs.csv"
    csv_path.write_text("path,label\nimgs/cat/0.png,cat\nimgs/dog/0.png,dog\n")
    ds2 = load_dataset(csv_path)
    assert ds2.kind == "image" and ds2.labels == [0, 1]
    np.testing.assert_array_equal(ds2.images[0], ds.images[0])


@pytest.mark.sanity
def test_npz(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([0, 1] * 5))
    ds = load_dataset(tmp_path / "d.npz")
    assert ds.kind == "tensor" and ds.x.shape == (10, 3) and ds.label_names == ["0", "1"]


@pytest.mark.sanity
def test_npz_named_arrays_and_word_labels(tmp_path: Path) -> None:
    ids = np.arange(12).reshape(4, 3)
    np.savez(
        tmp_path / "f.npz", input_ids=ids, attention_mask=np.ones_like(ids), y=np.array(["pos", "neg"] * 2)
    )
    ds = load_dataset(tmp_path / "f.npz")
    assert ds.kind == "feeds" and len(ds) == 4 and sorted(ds.feeds) == ["attention_mask", "input_ids"]
    assert ds.label_names == ["neg", "pos"] and ds.labels == [1, 0, 1, 0]
    assert ds.feeds["input_ids"].dtype == ids.dtype
    np.testing.assert_array_equal(ds.subset([2]).feeds["input_ids"], ids[2:3])
    with pytest.raises(DatasetError, match="needs labels in an array 'y'"):
        load_dataset(_npz(tmp_path / "u.npz", input_ids=ids))
    unlabelled = load_dataset(tmp_path / "u.npz", require_labels=False)
    assert unlabelled.labels is None and unlabelled.describe() == "4 feeds examples, unlabelled"
    with pytest.raises(DatasetError, match="labels go in the array 'y'"):
        load_dataset(_npz(tmp_path / "a.npz", x=ids, labels=np.array([0, 1, 0, 1])))
    with pytest.raises(DatasetError, match="use one of the two"):
        load_dataset(_npz(tmp_path / "b.npz", x=ids, input_ids=ids, y=np.array([0, 1, 0, 1])))


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.sanity
def test_unlabelled_data_for_calibration(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("text\nshort\na much longer sentence here\n")
    with pytest.raises(DatasetError, match="no label column"):
        load_dataset(tmp_path / "t.csv")
    ds = load_dataset(tmp_path / "t.csv", require_labels=False)
    assert ds.kind == "text" and ds.labels is None and ds.texts == ["short", "a much longer sentence here"]
    assert ds.class_ids() is None and ds.class_balance() == {}
    with pytest.raises(DatasetError, match="no labels"):
        ds.split(0.5)
    one = _write_csv(tmp_path / "one.csv", [("a", "pos"), ("b", "pos")])
    assert load_dataset(one, require_labels=False).label_names == ["pos"]  # one class is fine for inputs
    from PIL import Image

    (tmp_path / "flat").mkdir()
    for i in range(3):
        Image.fromarray(np.full((4, 5), i * 40, np.uint8)).save(tmp_path / "flat" / f"{i}.png")
    images = load_dataset(tmp_path / "flat", require_labels=False)
    assert images.kind == "image" and len(images) == 3 and images.labels is None
    assert images.images[0].shape == (4, 5, 1)


@pytest.mark.sanity
def test_class_ids_follow_the_models_labels() -> None:
    words = Dataset("text", [1, 0, 1], ["negative", "positive"], texts=["a", "b", "c"], source="mem")
    assert words.class_ids({0: "NEGATIVE", 1: "neutral", 2: "Positive"}) == [2, 0, 2]
    assert words.class_ids(None) == [1, 0, 1]  # no model labels: sorted-name order
    ids = Dataset("text", [1, 0], ["1", "3"], texts=["a", "b"], source="mem")
    assert ids.class_ids({0: "x", 1: "y", 2: "z", 3: "w"}) == [3, 1]  # integer labels are the ids


@pytest.mark.sanity
def test_sklearn_digits_and_stratified_split() -> None:
    ds = load_dataset("sklearn:digits")
    assert ds.kind == "image" and len(ds) == 1797 and ds.num_classes == 10
    assert ds.images[0].shape == (8, 8, 1) and ds.images[0].dtype == np.uint8
    train, val = ds.split(0.2, seed=0)
    assert len(train) + len(val) == len(ds)
    for name, count in ds.class_balance().items():
        assert abs(val.class_balance()[name] - 0.2 * count) <= 1
    again, _ = ds.split(0.2, seed=0)
    assert again.labels == train.labels
    other, _ = ds.split(0.2, seed=1)
    assert other.labels != train.labels or not np.array_equal(other.images[0], train.images[0])


@pytest.mark.must
def test_every_registered_reader_is_tested() -> None:
    assert set(READERS) == {"builtin", "npz", "image_folder", "table"}
    assert set(BUILTINS) == {"sklearn:digits"}


# --- errors --------------------------------------------------------------------------------------


def _error(tmp_path: Path, name: str, content: str, **kw: str) -> str:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError) as info:
        load_dataset(path, **kw)
    return str(info.value)


@pytest.mark.must
def test_missing_and_unknown_paths(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "nope.csv")
    with pytest.raises(DatasetError, match="unknown built-in"):
        load_dataset("sklearn:nope")
    (tmp_path / "x.parquet").write_text("x")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_dataset(tmp_path / "x.parquet")


@pytest.mark.must
def test_empty_files(tmp_path: Path) -> None:
    assert "is empty" in _error(tmp_path, "e.csv", "")
    assert "no rows" in _error(tmp_path, "h.csv", "text,label\n")
    assert "is empty" in _error(tmp_path, "e.jsonl", "\n")


@pytest.mark.must
def test_missing_columns_name_the_header(tmp_path: Path) -> None:
    msg = _error(tmp_path, "d.csv", "words,mood\nhi,1\n")
    assert "line 1" in msg and "no label column" in msg and "words" in msg
    msg = _error(tmp_path, "d2.csv", "text,label\nhi,1\nho,0\n", text_column="body")
    assert "no text column 'body'" in msg


@pytest.mark.must
def test_bad_rows_name_line_and_content(tmp_path: Path) -> None:
    msg = _error(tmp_path, "d.csv", "text,label\ngood,1\nbad,0,extra\n")
    assert "line 3" in msg and "bad,0,extra" in msg
    msg = _error(tmp_path, "d2.csv", "text,label\ngood,1\nno label here,\nx,0\n")
    assert "line 3" in msg and "empty label" in msg and "no label here" in msg
    msg = _error(tmp_path, "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", label: 0}\n')
    assert "line 2" in msg and "not valid JSON" in msg


@pytest.mark.must
def test_one_class_only(tmp_path: Path) -> None:
    msg = _error(tmp_path, "d.csv", "text,label\na,1\nb,1\n")
    assert "only one class" in msg and "'1'" in msg


@pytest.mark.must
def test_unreadable_image_names_the_line(tmp_path: Path) -> None:
    _write_images(tmp_path / "imgs", {"a": 1, "b": 1})
    (tmp_path / "imgs" / "b" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match="broken.png"):
        load_dataset(tmp_path / "imgs")
    msg = _error(tmp_path, "i.csv", "image,label\nimgs/a/0.png,a\nimgs/b/broken.png,b\n")
    assert "line 3" in msg and "cannot read image" in msg


@pytest.mark.sanity
def test_split_rejects_bad_fraction_and_tiny_classes() -> None:
    ds = Dataset("text", [0, 1, 1], ["a", "b"], texts=["x", "y", "z"], source="mem")
    with pytest.raises(DatasetError, match="val_fraction"):
        ds.split(1.5)
    with pytest.raises(DatasetError, match="at least 2 per class"):
        ds.split(0.5)
