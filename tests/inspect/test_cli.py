"""The inspect commands through the CLI: help, extract and --list, unknown tags, usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from modelexport.cli.app import main
from tests.helpers import message_lines


@pytest.mark.smoke
@pytest.mark.parametrize("command", ["analyze", "validate", "compare", "extract", "profile"])
def test_help(command: str, capsys: Any) -> None:
    assert main([command, "--help"]) == 0
    assert "Usage: modelexport " + command in capsys.readouterr().out


@pytest.mark.must
def test_extract_writes_runnable_model(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "layer.onnx"
    rc = main(
        [
            "extract",
            str(tiny_bert_export.onnx_path),
            "--module",
            "encoder.layer.1",
            "-o",
            str(out),
            "--format",
            "json",
        ]
    )
    assert rc == 0
    info = json.loads(capsys.readouterr().out)
    sub = onnx.load(str(out))
    onnx.checker.check_model(sub, full_check=True)
    assert [i.name for i in sub.graph.input] == info["external_inputs"] and len(sub.graph.node) == len(
        info["operations"]
    )


@pytest.mark.sanity
def test_extract_list(reuse_export: Any, capsys: Any) -> None:
    assert main(["extract", str(reuse_export[1].onnx_path), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["module", "path", "nodes", "calls", "module", "tag"]
    rows = {line.split()[-1]: line.split() for line in lines[1:]}  # path, nodes, calls, tag
    assert rows["/ReuseTwice/Block"] == ["block", "8", "2", "/ReuseTwice/Block"]
    assert rows["/ReuseTwice"] == ["(root)", "9", "1", "/ReuseTwice"]


@pytest.mark.must
def test_unknown_tag_close_matches_one_line(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "x.onnx"
    rc = main(
        [
            "extract",
            str(tiny_bert_export.onnx_path),
            "--module",
            "/BertModel/BertEncoder/BertLayr.1",
            "-o",
            str(out),
        ]
    )
    err = message_lines(capsys.readouterr().err)
    assert rc == 1 and len(err) == 2 and "close matches: /BertModel/BertEncoder/BertLayer.1" in err[0]
    assert "--list" in err[1] and not out.exists()


@pytest.mark.sanity
def test_usage_errors(tiny_bert_export: Any, capsys: Any) -> None:
    assert main(["extract", str(tiny_bert_export.onnx_path)]) == 2
    assert main(["validate"]) == 2
    assert (
        main(["extract", str(tiny_bert_export.onnx_path), "-m", "pooler", "-o", "x.onnx", "--call", "two"])
        == 2
    )
    assert main(["analyze", str(tiny_bert_export.onnx_path), "--depth", "0"]) == 1
    assert "depth must be >= 1" in capsys.readouterr().err


@pytest.mark.sanity
def test_profile_runtime_failure_is_one_line(tiny_bert_export: Any, tmp_path: Path, capsys: Any) -> None:
    import numpy as np

    ids = np.full((1, 4), 500, dtype=np.int64)  # beyond the 99-row vocabulary
    npz = tmp_path / "bad.npz"
    np.savez(npz, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    assert main(["profile", str(tiny_bert_export.onnx_path), "--inputs", str(npz)]) == 1
    err = message_lines(capsys.readouterr().err)
    assert len(err) == 2 and "ONNX Runtime failed to run the model" in err[0] and "idx=500" in err[0]
