"""Calibration and ``--eval-data`` through the one data stack: ``load_dataset`` + the model's own processor.

The README's command (``quantize --mode static --calibration-data dev.csv --calibrate-method entropy``)
used to fail on texts of different lengths ("inhomogeneous shape") and on word labels.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.cli.app import main
from modelexport.data import load_dataset
from modelexport.errors import DatasetError
from modelexport.inference.feeds import dataset_samples
from modelexport.inference.processors import ONNXAutoProcessor
from modelexport.onnxfile import load_onnx
from modelexport.optimize.calibration import load_samples
from modelexport.optimize.quantization import QDQ_OPS
from modelexport.runtime.session import create_session
from tests.optimize.conftest import bert_feeds

#: int8 (static QDQ) vs fp32 logits of the tiny classifier, per sentence: cosine and argmax agreement.
MIN_LOGIT_COSINE = 0.99
MIN_AGREEMENT = 0.95


def _fp32_accuracy(onnx_path: Path, words_csv: Path) -> float:
    """Accuracy computed without modelexport's data stack: transformers' tokenizer, one sentence at a time,
    word labels mapped through the model's own id2label."""
    from transformers import AutoConfig, AutoTokenizer

    folder = onnx_path.parent
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    label2id = {v: int(k) for k, v in AutoConfig.from_pretrained(str(folder)).id2label.items()}
    sess, _ = create_session(onnx_path)
    names = {i.name for i in sess.get_inputs()}
    with words_csv.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    hits = 0
    for row in rows:
        enc = tok(row["sentence"], return_tensors="np", truncation=True, max_length=64)
        logits = sess.run(None, {k: v.astype(np.int64) for k, v in enc.items() if k in names})[0]
        hits += int(logits.argmax(-1)[0] == label2id[row["sentiment"]])
    return hits / len(rows)


@pytest.mark.integration
@pytest.mark.parametrize("method", ["entropy", "minmax"])
def test_cli_static_quantization_on_text_with_word_labels(
    seq_cls_export: Any,
    sst2_words: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    method: str,
) -> None:
    onnx_path = Path(seq_cls_export.onnx_path)
    out = tmp_path / "q.onnx"
    args = ["quantize", str(onnx_path), "-o", str(out), "--mode", "static", "--calibrate-method", method]
    args += ["--calibration-data", str(sst2_words), "--calibration-samples", "32"]
    code = main([*args, "--eval-data", str(sst2_words), "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)  # stdout is the JSON alone (ORT's calibrator prints are kept out)
    assert report["calibration"] == {"kind": "text", "samples": 32, "method": method}
    assert {n.op_type for n in load_onnx(out).graph.node} & QDQ_OPS
    e = report["evaluation"]
    assert e["samples"] == 48
    assert e["mean_cosine"] > MIN_LOGIT_COSINE and e["agreement"] >= MIN_AGREEMENT
    # word labels go through the model's id2label (negative=0, positive=2), not their sorted order (0, 1)
    assert e["accuracy_fp32"] == pytest.approx(_fp32_accuracy(onnx_path, sst2_words))
    assert abs(e["accuracy_fp32"] - e["accuracy_quantized"]) <= 1 - MIN_AGREEMENT


@pytest.mark.integration
def test_text_batches_are_padded_per_batch_like_the_models_tokenizer(
    seq_cls_export: Any, sst2_words: Path
) -> None:
    from transformers import AutoTokenizer

    onnx_path = Path(seq_cls_export.onnx_path)
    dataset = load_dataset(sst2_words)
    samples = dataset_samples(dataset, ONNXAutoProcessor.sources(onnx_path), limit=12, batch_size=4)
    assert len(samples) == 12 and len(samples.feeds) == 3
    lengths = {f["input_ids"].shape[1] for f in samples.feeds}
    assert len(lengths) > 1, "each batch is padded to its own longest sentence"
    tok = AutoTokenizer.from_pretrained(str(onnx_path.parent), local_files_only=True)
    chosen = dataset.sample(12)
    for i, feed in enumerate(samples.feeds):
        texts = chosen.texts[4 * i : 4 * i + 4]
        expected = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="np")
        for name, array in feed.items():
            np.testing.assert_array_equal(array, expected[name])
    assert samples.labels == [
        2 if n == "positive" else 0 for n in np.array(chosen.label_names)[chosen.labels]
    ]


@pytest.mark.sanity
def test_npz_convention_names_the_models_inputs(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    model = load_onnx(tiny_bert_onnx)
    labelled = tmp_path / "labelled.npz"
    np.savez(labelled, **bert_feeds(6), y=np.array(["good", "bad"] * 3))
    samples = load_samples(labelled, model, tiny_bert_onnx, limit=4)
    assert samples.kind == "feeds" and len(samples) == 4 and samples.labels is not None
    assert {k: v.dtype for k, v in samples.feeds[0].items()} == {
        "input_ids": np.int64,
        "attention_mask": np.int64,
        "token_type_ids": np.int64,
    }
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 8), np.int64))
    with pytest.raises(DatasetError, match="single-input model.*input_ids"):
        load_samples(tmp_path / "x.npz", model, tiny_bert_onnx, limit=4)
    np.savez(tmp_path / "alias.npz", **bert_feeds(4), labels=np.arange(4))
    with pytest.raises(DatasetError, match="labels go in the array 'y'"):
        load_samples(tmp_path / "alias.npz", model, tiny_bert_onnx, limit=4)
    np.savez(tmp_path / "partial.npz", input_ids=bert_feeds(4)["input_ids"])
    with pytest.raises(DatasetError, match="attention_mask"):
        load_samples(tmp_path / "partial.npz", model, tiny_bert_onnx, limit=4)


@pytest.mark.sanity
def test_calibration_sample_limit_and_seed(tiny_bert_onnx: Path, bert_npz: Path) -> None:
    model = load_onnx(tiny_bert_onnx)
    first = load_samples(bert_npz, model, tiny_bert_onnx, limit=5, seed=1)
    again = load_samples(bert_npz, model, tiny_bert_onnx, limit=5, seed=1)
    other = load_samples(bert_npz, model, tiny_bert_onnx, limit=5, seed=2)
    ids = [np.concatenate([f["input_ids"] for f in s.feeds]) for s in (first, again, other)]
    assert len(first) == 5 and len(first.feeds) == 5
    np.testing.assert_array_equal(ids[0], ids[1])
    assert not np.array_equal(ids[0], ids[2])
