"""Quantization with ONNX Runtime on real exports: tags, metadata, sidecar, exclusions, accuracy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.errors import ConfigError, DatasetError, OnnxFileError, OutputExistsError
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.inference.feeds import FEEDERS
from modelexport.metadata import read_metadata
from modelexport.optimize.config import QUANT_MODES
from modelexport.optimize.quantization import QDQ_OPS, QUANT_OPS, quantize
from modelexport.runtime.session import create_session
from tests.optimize.conftest import bert_feeds

#: Registry entries and the tests that exercise them (a new entry without a test fails here).
TESTED_MODES = {"dynamic", "static"}
#: Dataset kinds turned into feeds: feeds (bert_npz), tensor (digits x), image (folder), text (CSV).
TESTED_FEEDERS = {"feeds", "tensor", "image", "text"}
#: int8 vs fp32 on random-weight tiny BERT: cosine of last_hidden_state per sample.
MIN_COSINE = 0.99
#: Accuracy points a trained classifier may lose after int8 (held-out digits, 450 images).
MAX_ACCURACY_DROP = 0.02


def _tags(model: onnx.ModelProto) -> dict[str, str | None]:
    return {n.name: {p.key: p.value for p in n.metadata_props}.get(TAG_KEY) for n in model.graph.node}


def _cosines(a_path: Path, b_path: Path, feeds: dict[str, np.ndarray]) -> list[float]:
    a, _ = create_session(a_path)
    b, _ = create_session(b_path)
    ya, yb = a.run(None, feeds)[0], b.run(None, feeds)[0]
    out = []
    for u, v in zip(ya.reshape(len(ya), -1), yb.reshape(len(yb), -1), strict=True):
        out.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))))
    return out


@pytest.mark.must
def test_every_registry_entry_has_a_test() -> None:
    assert set(QUANT_MODES) == TESTED_MODES
    assert set(FEEDERS) == TESTED_FEEDERS


@pytest.mark.must
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_quantize_keeps_tags_metadata_and_sidecar(
    tiny_bert_onnx: Path, bert_npz: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "q.onnx"
    result = quantize(
        tiny_bert_onnx,
        out,
        mode=mode,
        calibration_data=str(bert_npz) if mode == "static" else None,
        progress=False,
    )
    q = onnx.load(out)
    assert result.coverage["coverage_pct"] == 100.0 and all(_tags(q).values())
    ops = {n.op_type for n in q.graph.node}
    assert ops & (QUANT_OPS if mode == "dynamic" else QDQ_OPS)
    assert result.size_after < result.size_before
    assert sum(result.quantized_per_module.values()) > 0
    # metadata: every input key carried over, quantization recorded, checksum valid
    before, after = read_metadata(tiny_bert_onnx), read_metadata(out)
    assert set(before) <= set(after)
    assert after["hf_model_config"] == before["hf_model_config"]
    assert after["modelexport.quantization"]["mode"] == mode
    # sidecar: one entry per output node, tags equal to the nodes' own
    side = json.loads((tmp_path / "q_hierarchy.json").read_text())
    assert len(side["nodes"]) == len(q.graph.node) and side["coverage"]["coverage_pct"] == 100.0
    assert side["transforms"][-1]["kind"] == "quantize"
    assert all(side["nodes"][n.name]["tag"] == _tags(q)[n.name] for n in q.graph.node if n.name)
    # outputs: int8 close to fp32
    assert min(_cosines(tiny_bert_onnx, out, bert_feeds(4, seed=7))) > MIN_COSINE


@pytest.mark.must
def test_inserted_nodes_inherit_the_tag_of_the_node_they_serve(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    quantize(tiny_bert_onnx, tmp_path / "q.onnx", mode="dynamic", progress=False)
    q = onnx.load(tmp_path / "q.onnx")
    tags = _tags(q)
    consumers: dict[str, list[str]] = {}
    for n in q.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    for n in q.graph.node:
        if n.op_type == "MatMulInteger":
            # the MatMul it replaced was inside a Linear/attention module, never the root
            assert tags[n.name].count("/") >= 2, (n.name, tags[n.name])
        if n.op_type == "DynamicQuantizeLinear":
            served = {tags[c] for c in consumers[n.output[0]]}
            assert all(t.startswith(tags[n.name]) for t in served), (n.name, tags[n.name], served)


def _float_ok(model: onnx.ModelProto, names: set[str]) -> None:
    by_name = {n.name: n for n in model.graph.node}
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    for name in names:
        # the excluded node is still there under its own name (a Gemm may become <name>_MatMul + _Add)
        node = by_name.get(name) or by_name[f"{name}_MatMul"]
        assert node.op_type not in QUANT_OPS
        assert not any(i in dq_out for i in node.input), f"{name} is fed by DequantizeLinear"


@pytest.mark.must
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_excluded_modules_stay_float(tiny_bert_onnx: Path, bert_npz: Path, tmp_path: Path, mode: str) -> None:
    src = onnx.load(tiny_bert_onnx)
    patterns = ("*/BertEmbeddings*", "*LayerNorm*", "*/BertPooler*")
    result = quantize(
        tiny_bert_onnx,
        tmp_path / "q.onnx",
        mode=mode,
        exclude_modules=patterns,
        calibration_data=str(bert_npz),
        progress=False,
        preprocess=False,
    )
    excluded = {
        n.name
        for n in src.graph.node
        if any(s in (_tags(src)[n.name] or "") for s in ("BertEmbeddings", "LayerNorm", "BertPooler"))
    }
    assert excluded <= set(result.excluded_nodes)
    q = onnx.load(tmp_path / "q.onnx")
    _float_ok(q, excluded)
    assert not any("BertEmbeddings" in m or "BertPooler" in m for m in result.quantized_per_module)
    assert any("BertLayer" in m for m in result.quantized_per_module)


@pytest.mark.sanity
def test_bad_exclude_pattern_names_the_modules(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="matches no module.*BertModel"):
        quantize(tiny_bert_onnx, tmp_path / "q.onnx", exclude_modules=("*NoSuchModule*",), progress=False)
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.sanity
def test_static_without_calibration_data_is_refused(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="calibration data"):
        quantize(tiny_bert_onnx, tmp_path / "q.onnx", mode="static", progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.sanity
def test_bad_inputs_raise_typed_errors(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(OnnxFileError):
        quantize(tmp_path / "missing.onnx", tmp_path / "q.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(OnnxFileError):
        quantize(tmp_path / "junk.onnx", tmp_path / "q.onnx")
    with pytest.raises(DatasetError):
        quantize(
            tiny_bert_onnx,
            tmp_path / "out" / "q.onnx",
            mode="static",
            calibration_data=str(tmp_path / "nope.npz"),
        )
    with pytest.raises(ConfigError, match="calibrate_method"):
        quantize(tiny_bert_onnx, tmp_path / "out" / "q.onnx", calibrate_method="median")
    with pytest.raises(OutputExistsError, match="is an input of this run"):
        quantize(tiny_bert_onnx, tiny_bert_onnx)
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "out").exists()


@pytest.mark.sanity
def test_error_report_and_eval(tiny_bert_onnx: Path, bert_npz: Path, tmp_path: Path) -> None:
    result = quantize(
        tiny_bert_onnx,
        tmp_path / "q.onnx",
        mode="static",
        calibration_data=str(bert_npz),
        calibration_samples=8,
        error_report=True,
        eval_data=bert_npz,
        progress=False,
    )
    report = result.error_report
    assert {r["module"] for r in report} >= {"/BertModel/BertEmbeddings", "/BertModel/BertEncoder"}
    assert [r["max_abs_error"] for r in report] == sorted((r["max_abs_error"] for r in report), reverse=True)
    assert all(r["max_abs_error"] > 0 and r["mean_abs_error"] <= r["max_abs_error"] for r in report)
    assert result.evaluation["samples"] == 16 and result.evaluation["mean_cosine"] > MIN_COSINE
    assert result.calibration == {"kind": "feeds", "samples": 8, "method": "minmax"}


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_trained_classifier_keeps_accuracy_after_int8(digits: Any, tmp_path: Path, mode: str) -> None:
    result = quantize(
        digits.onnx_path,
        tmp_path / "q.onnx",
        mode=mode,
        calibration_data=str(digits.calib_npz),
        per_channel=mode == "static",
        eval_data=digits.test_npz,
        eval_samples=1000,
        progress=False,
    )
    e = result.evaluation
    assert e["samples"] == 450
    assert e["accuracy_fp32"] == pytest.approx(digits.torch_accuracy, abs=0.003)
    assert e["accuracy_fp32"] > 0.85, "the classifier did not train"
    assert e["accuracy_fp32"] - e["accuracy_quantized"] <= MAX_ACCURACY_DROP
    assert e["agreement"] >= 0.97
    assert result.coverage["coverage_pct"] == 100.0


def _write_digit_images(root: Path, n: int = 12, classes: bool = True) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    for i in range(n):
        folder = root / str(y[i]) if classes else root
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((x[i].reshape(8, 8) * 255 / 16).astype(np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.mark.integration
@pytest.mark.parametrize("classes", [True, False], ids=["class-folders", "flat-unlabelled"])
def test_static_calibration_from_an_image_folder(digits: Any, tmp_path: Path, classes: bool) -> None:
    images = _write_digit_images(tmp_path / "images", classes=classes)
    result = quantize(
        digits.onnx_path,
        tmp_path / "q.onnx",
        mode="static",
        calibration_data=str(images),
        calibration_samples=8,
        progress=False,
    )
    assert result.calibration["kind"] == "image" and result.calibration["samples"] == 8
    assert result.coverage["coverage_pct"] == 100.0


@pytest.mark.slow
@pytest.mark.integration
def test_static_calibration_from_text_through_the_models_tokenizer(
    minilm_export: Any, sst2_dir: Path, tmp_path: Path
) -> None:
    result = quantize(
        minilm_export.onnx_path,
        tmp_path / "q.onnx",
        mode="static",
        calibration_data=str(sst2_dir / "dev.csv"),
        calibration_samples=8,
        progress=False,
        op_types=("MatMul",),
        eval_data=sst2_dir / "dev.csv",
        eval_samples=8,
    )
    assert result.calibration["kind"] == "text" and result.calibration["samples"] == 8
    assert result.coverage["coverage_pct"] == 100.0
    # static QDQ of every MatMul (attention scores included) on 8 sentences is lossy: a bound, not a target
    assert result.evaluation["mean_cosine"] > 0.8


@pytest.mark.sanity
@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_calibration_methods(digits: Any, tmp_path: Path, method: str) -> None:
    result = quantize(
        digits.onnx_path,
        tmp_path / "q.onnx",
        mode="static",
        calibration_data=str(digits.calib_npz),
        calibration_samples=32,
        calibrate_method=method,
        eval_data=digits.test_npz,
        progress=False,
    )
    assert read_metadata(tmp_path / "q.onnx")["modelexport.quantization"]["calibrate_method"] == method
    assert result.coverage["coverage_pct"] == 100.0
    assert result.evaluation["accuracy_fp32"] - result.evaluation["accuracy_quantized"] <= 0.05


@pytest.mark.regression
def test_dynamic_quantization_of_a_dynamo_exported_cnn(tmp_path: Path) -> None:
    """The dynamo exporter writes shape hints for weights; the quantizer transposes the head's weight and
    used to fail shape inference on the stale hint ("Inferred shape and existing shape differ")."""
    import onnx
    import torch

    import modelexport
    from modelexport.train.cnn import CompactCNN

    torch.manual_seed(0)
    exported = modelexport.export(
        CompactCNN(1, 10, (8, 8)), tmp_path / "cnn", keep_batchnorm=True, exporter="dynamo"
    )
    source = onnx.load(str(exported.onnx_path))
    inits = {t.name for t in source.graph.initializer}
    hinted = [vi.name for vi in source.graph.value_info if vi.name in inits]
    if not hinted:
        pytest.skip("this exporter version writes no initializer shape hints; nothing to regress")
    result = quantize(exported.onnx_path, tmp_path / "cnn_dynamic.onnx", mode="dynamic")
    assert result.output_path.is_file()
    assert len(onnx.load(str(exported.onnx_path)).graph.value_info) == len(source.graph.value_info), (
        "input untouched"
    )
    quantized = onnx.load(str(result.output_path))
    assert all(any(p.key == TAG_KEY for p in n.metadata_props) for n in quantized.graph.node)
