"""Metadata embedded by ``modelexport export``: schema, task, processor config, package files, speed, size."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import MetadataIntegrityError
from modelexport.metadata import clear_cache, read_metadata, write_metadata
from modelexport.metadata import schema as S


@pytest.mark.must
def test_minilm_metadata_schema(minilm_export: Any, minilm_dir: Path) -> None:
    meta = read_metadata(minilm_export.onnx_path)
    assert meta[S.KEY_VERSION] == "2.0"
    assert meta[S.KEY_TASK] == "feature-extraction"
    assert meta[S.KEY_MODEL_CONFIG]["model_type"] == "bert" and meta[S.KEY_MODEL_CONFIG]["hidden_size"] == 384
    tok = meta[S.KEY_PROCESSOR_CONFIG]
    assert tok["processor_type"] == "tokenizer" and tok["processor_kinds"] == ["tokenizer"]
    assert tok["do_lower_case"] is True and tok["tokenizer_class"].startswith("BertTokenizer")
    assert tok["special_tokens"]["cls_token"] == "[CLS]" and tok["model_max_length"] > 0
    cfg = meta[S.KEY_EXPORT_CONFIG]
    assert cfg["hierarchy_tags_enabled"] is True and cfg["opset"] >= 17 and cfg["exporter"] == "dynamo"
    assert [i["name"] for i in meta[S.KEY_INPUTS]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert (
        meta[S.KEY_OUTPUTS][0]["name"] == "last_hidden_state" and meta[S.KEY_OUTPUTS][0]["shape"][-1] == 384
    )
    assert meta[S.KEY_TIMESTAMP].endswith("+00:00") and meta[S.KEY_EXPORTER_VERSION]
    # the versions it was exported with; no path of the exporting machine (the source was a local folder)
    assert {"transformers", "tokenizers", "torch"} <= set(meta[S.KEY_LIBRARIES])
    assert "_name_or_path" not in meta[S.KEY_MODEL_CONFIG]
    assert str(minilm_dir) not in json.dumps(meta)


@pytest.mark.must
def test_minilm_metadata_speed_and_size(minilm_export: Any) -> None:
    """Read < 100 ms on the 90 MB model without the weights; extraction < 500 ms; size < 100 KB."""
    path = minilm_export.onnx_path
    assert path.stat().st_size > 80e6
    clear_cache()
    start = time.perf_counter()
    read_metadata(path)
    read_ms = (time.perf_counter() - start) * 1000
    stats = minilm_export.package.metadata_stats
    print(
        f"metadata: read {read_ms:.2f} ms (90 MB model), extract {stats.extract_ms} ms, {stats.bytes} bytes"
    )
    assert read_ms < 100
    assert stats.extract_ms < 500
    assert stats.bytes < 100 * 1024


@pytest.mark.must
def test_package_files_as_the_source_has_them(minilm_export: Any, minilm_dir: Path) -> None:
    out = minilm_export.output_dir
    for name in (
        "model.onnx",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "export_metadata.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
    doc = json.loads((out / "export_metadata.json").read_text())
    assert doc["metadata"][S.KEY_TASK] == read_metadata(out)[S.KEY_TASK]
    assert "config.json" in doc["files"]


@pytest.mark.must
@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("seq_cls", "text-classification"),
        ("token_cls", "token-classification"),
        ("qa", "question-answering"),
        ("image_cls", "image-classification"),
        ("audio_cls", "audio-classification"),
        ("object_det", "object-detection"),
    ],
)
def test_task_detected_from_architecture(task_export: Any, name: str, task: str) -> None:
    meta = read_metadata(task_export(name).onnx_path)
    assert meta[S.KEY_TASK] == task
    kinds = {
        "image_cls": "image_processor",
        "object_det": "image_processor",
        "audio_cls": "feature_extractor",
    }
    assert meta[S.KEY_PROCESSOR_CONFIG]["processor_type"] == kinds.get(name, "tokenizer")


@pytest.mark.sanity
def test_task_override(export_cache: Any) -> None:
    from tests.models.hf_models import tiny_hf_model

    result = export_cache.get("tiny_bert_task", lambda: tiny_hf_model("bert"), task="sentiment-analysis")
    assert read_metadata(result.onnx_path)[S.KEY_TASK] == "text-classification"  # alias normalised


@pytest.mark.must
def test_plain_torch_model_gets_user_task_and_no_config(cnn_export: Any) -> None:
    out = cnn_export.output_dir
    meta = read_metadata(out)
    assert meta[S.KEY_TASK] == "image-classification"
    assert meta[S.KEY_MODEL_CONFIG]["id2label"]["3"] == "three"
    assert meta[S.KEY_PROCESSOR_CONFIG]["size"] == {"height": 8, "width": 8}
    assert meta[S.KEY_PROCESSOR_CONFIG]["processor_type"] == "image_processor"
    assert not (out / "config.json").exists()
    assert any("no config.json" in n for n in cnn_export.notes)


@pytest.mark.sanity
def test_no_embed_metadata(cnn_nometa_export: Any) -> None:
    result = cnn_nometa_export
    assert read_metadata(result.onnx_path) == {}
    assert not (result.output_dir / "export_metadata.json").exists()


def _copy(result: Any, tmp_path: Path) -> Path:
    dst = tmp_path / "pkg"
    shutil.copytree(result.output_dir, dst)
    return dst / "model.onnx"


def _tamper(path: Path, key: str, value: str) -> None:
    proto = onnx.load(str(path))
    for prop in proto.metadata_props:
        if prop.key == key:
            prop.value = value
    onnx.save(proto, str(path))


@pytest.mark.must
def test_tampered_metadata_cli_error_and_force_repair(
    cnn_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy(cnn_export, tmp_path)
    _tamper(path, S.KEY_TASK, "text-classification")
    with pytest.raises(MetadataIntegrityError):
        read_metadata(path)
    assert main(["metadata", str(path)]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "Hint:" in err
    before = path.read_bytes()
    assert main(["metadata", str(path), "--set", "note=x"]) == 1
    assert path.read_bytes() == before
    assert main(["metadata", str(path), "--set", f"{S.KEY_TASK}=image-classification", "--force"]) == 0
    assert read_metadata(path)[S.KEY_TASK] == "image-classification"


@pytest.mark.smoke
def test_metadata_cli_print_and_set(
    cnn_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _copy(cnn_export, tmp_path)
    assert main(["metadata", str(path.parent)]) == 0
    assert "hf_pipeline_task: image-classification" in capsys.readouterr().out
    assert (
        main(
            [
                "metadata",
                str(path),
                "--set",
                'modelexport.quantization={"mode": "dynamic"}',
                "--set",
                "owner=team",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["metadata", str(path), "--json", "--key", "modelexport.quantization", "--key", "owner"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "modelexport.quantization": {"mode": "dynamic"},
        "owner": "team",
    }
    assert main(["metadata", str(path), "--set", "novalue"]) == 1
    assert "key=value" in capsys.readouterr().err


@pytest.mark.sanity
def test_large_value_is_compressed_in_the_file(cnn_export: Any, tmp_path: Path) -> None:
    path = _copy(cnn_export, tmp_path)
    big = {"table": [[i, str(i) * 3] for i in range(3000)]}
    write_metadata(path, {"modelexport.calibration": big})
    raw = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert raw["modelexport.calibration"].startswith("gzip+base64:")
    assert read_metadata(path)["modelexport.calibration"] == json.loads(json.dumps(big))
