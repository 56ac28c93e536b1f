"""Loading for inspection: each kind of bad file is a typed error with a clear message, via API and CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelexport.cli.app import main
from modelexport.errors import OnnxFileError
from modelexport.inspect.loading import load_tagged_model
from tests.helpers import message_lines

EXPECTED = {"missing": "not found", "text": "not an ONNX model", "truncated": "truncated", "empty": "empty"}


@pytest.mark.must
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_bad_file_is_onnx_file_error(bad_files: dict[str, Path], kind: str) -> None:
    with pytest.raises(OnnxFileError, match=EXPECTED[kind]):
        load_tagged_model(bad_files[kind])


@pytest.mark.must
@pytest.mark.parametrize("command", ["analyze", "validate", "extract", "profile"])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_cli_bad_file_one_line_no_traceback(
    bad_files: dict[str, Path], kind: str, command: str, capsys: Any, tmp_path: Path
) -> None:
    extra = ["--module", "x", "-o", str(tmp_path / "sub.onnx")] if command == "extract" else []
    rc = main([command, str(bad_files[kind]), *extra])
    err = capsys.readouterr().err
    assert rc == 1
    lines = message_lines(err)
    assert lines[0].startswith("Error: ") and EXPECTED[kind] in lines[0]
    assert lines[1].startswith("Hint: ") and len(lines) == 2 and "Traceback" not in err
    assert not (tmp_path / "sub.onnx").exists()


@pytest.mark.sanity
def test_folder_and_sidecar_are_found(tiny_bert_export: Any) -> None:
    tm = load_tagged_model(tiny_bert_export.output_dir)
    assert tm.path == Path(tiny_bert_export.onnx_path) and tm.sidecar is not None
    assert len(tm.index) == len(tm.proto.graph.node) == tm.sidecar["coverage"]["total_nodes"]
    assert load_tagged_model(tiny_bert_export.onnx_path, hierarchy=False).sidecar is None


@pytest.mark.must
def test_structure_only_load_equals_full_parse_without_payloads(tiny_bert_export: Any) -> None:
    import onnx

    from modelexport.onnxfile import load_structure

    full = onnx.load(str(tiny_bert_export.onnx_path))
    for init in full.graph.initializer:
        for name in (
            "raw_data",
            "float_data",
            "int32_data",
            "int64_data",
            "double_data",
            "uint64_data",
            "string_data",
        ):
            init.ClearField(name)
    light = load_structure(tiny_bert_export.onnx_path)
    assert light.SerializeToString() == full.SerializeToString()
    assert len(light.graph.initializer) > 0 and all(not i.raw_data for i in light.graph.initializer)
    tm = load_tagged_model(tiny_bert_export.onnx_path, weights=False)
    assert (
        not tm.has_weights
        and tm.index.initializers == load_tagged_model(tiny_bert_export.onnx_path).index.initializers
    )


@pytest.mark.sanity
def test_truncated_file_fails_in_structure_mode_too(bad_files: dict[str, Path]) -> None:
    with pytest.raises(OnnxFileError, match="truncated"):
        load_tagged_model(bad_files["truncated"], weights=False)


@pytest.mark.sanity
def test_external_data_models(tiny_bert_export: Any, tmp_path: Path) -> None:
    import onnx

    from modelexport.inspect.analyze import analyze
    from modelexport.inspect.extract import extract_module_subgraph
    from modelexport.inspect.validate import validate

    path = tmp_path / "model.onnx"
    proto = onnx.load(str(tiny_bert_export.onnx_path))
    onnx.save(proto, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    assert analyze(path).parameters == analyze(tiny_bert_export.onnx_path).parameters
    assert validate(path).ok
    sub = extract_module_subgraph(path, None, "/BertModel/BertPooler")
    assert all(i.HasField("raw_data") for i in sub.model.graph.initializer)  # weights carried, not references
    (tmp_path / "model.onnx.data").rename(tmp_path / "elsewhere.data")
    with pytest.raises(OnnxFileError, match="external data"):
        load_tagged_model(path)
    assert not validate(path).ok
