"""Hostile input, second pass (issue 31): deep tags, package files linked from outside, datasets the parsers
cannot take, bad option values and the messages they get. Each case keeps the contract of
:func:`tests.fuzz.harness.problems` (exit 0 or 1, no traceback, no stray files) and checks its own message.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import onnx
import pytest

from modelexport.hierarchy.tags import MAX_TAG_DEPTH, TAG_KEY
from tests.fuzz.harness import problems, run_inprocess, snapshot


def _outcome(argv: list[str], folder: Path, limit_s: float = 60) -> tuple[int | None, str]:
    before = snapshot(folder)
    outcome = run_inprocess(argv, limit_s)
    assert not problems(outcome, before, snapshot(folder)), (argv, outcome.output)
    return outcome.code, outcome.output


def _error_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("Error:"))


def _deep_copy(src: Path, dst: Path, depth: int) -> Path:
    """``src`` with one node's tag ``/A/A/...`` of ``depth`` levels (the sidecar removed: it no longer fits)."""
    shutil.copytree(src, dst)
    model = onnx.load(str(dst / "model.onnx"))
    for prop in model.graph.node[0].metadata_props:
        if prop.key == TAG_KEY:
            prop.value = "/A" * depth
    onnx.save(model, str(dst / "model.onnx"))
    (dst / "model_hierarchy.json").unlink()
    return dst


@pytest.mark.regression
def test_deep_tags_take_linear_time_up_to_the_bound_and_are_refused_past_it(
    fuzz_source: Path, tmp_path: Path
) -> None:
    """A tag of 5,000 levels made analyze run for minutes (quadratic and cubic work per level)."""
    at_bound = _deep_copy(fuzz_source, tmp_path / "bound", MAX_TAG_DEPTH)
    for command in (["analyze"], ["extract", "--list"], ["profile", "--runs", "1", "--warmup", "0"]):
        start = time.perf_counter()
        code, output = _outcome([command[0], str(at_bound), *command[1:]], at_bound)
        assert code == 0 and time.perf_counter() - start < 10, (command, output)
    past = _deep_copy(fuzz_source, tmp_path / "past", 5000)
    for command in ("analyze", "extract", "validate"):
        start = time.perf_counter()
        code, output = _outcome([command, str(past)] + (["--list"] if command == "extract" else []), past)
        assert code == 1 and time.perf_counter() - start < 10, (command, output)
        assert "5,000 levels" in _error_line(output) and f"at most {MAX_TAG_DEPTH} levels" in output


@pytest.mark.regression
@pytest.mark.parametrize("name", ["chat_template.jinja", "added_tokens.json", "special_tokens_map.json"])
def test_a_package_file_linked_from_outside_the_folder_is_refused(
    tiny_text_base: Path, tmp_path: Path, name: str
) -> None:
    """Its target's content would be copied into a package users share (a system account file, once)."""
    folder = Path(shutil.copytree(tiny_text_base, tmp_path / "model"))
    secret = tmp_path / "secret.txt"
    secret.write_text("NOT FOR SHARING\n")
    (folder / name).unlink(missing_ok=True)
    os.symlink(secret, folder / name)
    code, output = _outcome(["export", str(folder), str(tmp_path / "out") + "/"], tmp_path)
    assert code == 1 and "symbolic link" in _error_line(output) and str(secret) in output
    assert not (tmp_path / "out").exists()


def test_a_hugging_face_cache_snapshot_may_link_to_its_own_blobs(tmp_path: Path) -> None:
    """The hub cache's layout: snapshots/REV/file -> ../../blobs/HASH (not "outside" the model)."""
    from modelexport.metadata.package import safe_join

    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_text("{}")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/abc123", snapshot / "tokenizer_config.json")
    assert safe_join(snapshot, "tokenizer_config.json").read_text() == "{}"


DATASETS = {
    "latin1.csv": ("text,label\ncaf\xe9,1\nbad,0\n".encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    "long-field.csv": (b"text,label\n" + b"a" * 200_000 + b",1\nb,0\n", "field over"),
    "deep.json": (b"[" * 5000 + b"]" * 5000, "nested deeper"),
}


@pytest.mark.regression
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_datasets_the_parsers_cannot_take_are_one_line_errors(tmp_path: Path, name: str) -> None:
    data, message = DATASETS[name]
    (tmp_path / name).write_bytes(data)
    argv = ["pipeline", "--dataset_path", str(tmp_path / name), "--model_type", "text_classifier"]
    code, output = _outcome([*argv, "--output_model", str(tmp_path / "out") + "/"], tmp_path)
    assert code == 1 and message in _error_line(output), output


def _linear(tmp_path: Path) -> str:
    (tmp_path / "lin.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(3, 2)\n")
    return f"{tmp_path / 'lin.py'}:make"


@pytest.mark.regression
def test_bad_option_values_are_refused_before_work(
    fuzz_source: Path, minilm_export: object, tmp_path: Path
) -> None:
    text = str(minilm_export.output_dir)  # type: ignore[attr-defined]
    specs = tmp_path / "specs.json"
    cases = [
        (["export", _linear(tmp_path), str(tmp_path / "a/"), "--input-specs", "{batch0}"], "must be >= 1"),
        (["export", _linear(tmp_path), str(tmp_path / "b/"), "--input-specs", "{dup}"], "must be unique"),
        (["metadata", "{copy}", "--set", "modelexport.metadata_checksum=x"], "cannot be set"),
        (["profile", str(fuzz_source), "--ep", "NopeExecutionProvider"], "unknown execution provider"),
        (
            ["infer", str(minilm_export.output_dir), "--question", "who?", "--text", "john"],
            "--question is for",
        ),  # type: ignore[attr-defined]
        (["optimize", text, "-o", str(tmp_path / "o1/"), "--num-heads", "0"], "num_heads must be > 0"),
        (["optimize", text, "-o", str(tmp_path / "o2/"), "--model-type", "nope"], "fusion families"),
        (["pipeline", "--dataset_path", "sklearn:digits", "--seed", "-1"], "seed must be"),
        (["pipeline", "--dataset_path", "sklearn:digits", "--seed", str(2**64)], "seed must be"),
    ]
    for argv, message in cases:
        shutil.rmtree(tmp_path / "copy", ignore_errors=True)
        shutil.copytree(fuzz_source, tmp_path / "copy")
        specs.write_text(json.dumps({"inputs": [{"name": "x", "shape": [0, 3]}]}))
        (tmp_path / "dup.json").write_text(json.dumps({"inputs": [{"name": "x", "shape": [2, 3]}] * 2}))
        values = {"batch0": str(specs), "dup": str(tmp_path / "dup.json"), "copy": str(tmp_path / "copy")}
        argv = [a.format(**values) for a in argv]
        if argv[0] == "pipeline":
            argv += ["--output_model", str(tmp_path / "p") + "/"]
        start = time.perf_counter()
        code, output = _outcome(argv, tmp_path)
        assert code == 1 and message in _error_line(output) and time.perf_counter() - start < 20, (
            argv,
            output,
        )
    outcome = run_inprocess(["infer", text, "--text", "hi", "--top-k", "0"], 30)
    assert outcome.code == 2 and "'--top-k': 0 is not in the range" in outcome.output  # click's usage error


@pytest.mark.regression
def test_messages_name_the_real_cause(fuzz_source: Path, fuzz_image: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a file, not a folder")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    broken = Path(shutil.copytree(fuzz_source, tmp_path / "broken"))
    model = onnx.load(str(broken / "model.onnx"))
    model.graph.node[0].op_type = "Loop"  # onnx.checker-valid bytes, but ORT cannot build the graph
    onnx.save(model, str(broken / "model.onnx"))
    (tmp_path / "bad.png").write_text("not an image")
    lin = _linear(tmp_path)
    cases = [
        (
            ["export", lin, str(tmp_path / "afile" / "out") + "/", "--input-shape", "2,3"],
            "is a file, not a folder",
        ),
        (["export", lin, str(tmp_path / "dangling"), "--input-shape", "2,3"], "which does not exist"),
        (["compare", str(broken), str(fuzz_source), "--numeric"], "ONNX Runtime cannot load"),
        (
            ["extract", str(fuzz_source), "-m", "/SmallCNN", "--call", "-1", "-o", str(tmp_path / "x") + "/"],
            "--call",
        ),
        (["infer", str(fuzz_source), "--image", str(tmp_path / "bad.png")], "PNG, JPEG"),
    ]
    for argv, message in cases:
        code, output = _outcome(argv, tmp_path)
        assert code == 1 and message in output and "provider" not in _error_line(output).lower(), (
            argv,
            output,
        )
    assert "validate --repair" not in _outcome(cases[3][0], tmp_path)[1]
