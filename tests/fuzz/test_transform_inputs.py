"""Hostile input to the transforms (issue 31): ``quantize`` on graphs ONNX Runtime refuses, tampered metadata or
sidecars that ``quantize``/``optimize`` would carry and re-sign, and ``--eval-data``/``--calibration-data`` files
the readers or the model cannot take. Each is refused in one line naming the file, before any output is written.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from modelexport.metadata import read_metadata, schema
from modelexport.metadata._proto import read_props, rewrite_props
from modelexport.runtime.session import load_reason
from tests.fuzz.harness import problems, run_inprocess, run_subprocess, snapshot


def _error(argv: list[str], folder: Path) -> str:
    """Run ``argv``: exit 1 within the contract, nothing new in ``folder``; the output."""
    before = snapshot(folder)
    outcome = run_inprocess(argv, 60)
    assert not problems(outcome, before, snapshot(folder)), (argv, outcome.output)
    assert outcome.code == 1 and snapshot(folder) == before, (argv, outcome.output)
    errors = [line for line in outcome.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, outcome.output
    return errors[0]


def _self_call(model: onnx.ModelProto) -> None:
    call = helper.make_node("F", ["a"], ["b"], domain="local")
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("local", 1)]
    model.functions.append(helper.make_function("local", "F", ["a"], ["b"], [call], opsets))
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.graph.node[1].op_type, model.graph.node[1].domain = "F", "local"


def _huge(model: onnx.ModelProto) -> None:
    weight = next(t for t in model.graph.initializer if len(t.dims) == 2)
    del weight.dims[:]
    weight.dims.extend([1 << 31, 1 << 31])


#: Graphs ONNX Runtime's quantizer took (or failed on with its own traceback) though the runtime cannot load them.
UNLOADABLE: dict[str, Callable[[onnx.ModelProto], None]] = {
    "loop": lambda m: setattr(m.graph.node[0], "op_type", "Loop"),
    "unknown-initializer": lambda m: m.graph.node[0].input.__setitem__(1, "weight_nope"),
    "self-calling-function": _self_call,
    "huge-initializer": _huge,
}


def _broken_copy(source: Path, folder: Path, edit: Callable[[onnx.ModelProto], None]) -> Path:
    shutil.copytree(source, folder)
    model = onnx.load(str(folder / "model.onnx"))
    edit(model)
    onnx.save(model, str(folder / "model.onnx"))
    return folder


@pytest.mark.regression
@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_quantize_refuses_a_model_onnx_runtime_cannot_load(
    fuzz_source: Path, tmp_path: Path, case: str
) -> None:
    """7 such models once quantized with exit 0 into a file that does not load either."""
    folder = _broken_copy(fuzz_source, tmp_path / case, UNLOADABLE[case])
    line = _error(["quantize", str(folder), "-o", str(folder / "q.onnx")], tmp_path)
    assert f"ONNX Runtime cannot load {folder / 'model.onnx'}:" in line, line
    assert (
        "onnxruntime_src" not in line and "[ONNXRuntimeError]" not in line and "Load model from" not in line
    )


@pytest.mark.regression
def test_quantize_prints_no_onnx_runtime_logs_or_tracebacks_without_debug(
    fuzz_source: Path, tmp_path: Path
) -> None:
    """ORT's C++ log lines go to the process's stderr, so this runs the console entry point."""
    folder = _broken_copy(fuzz_source, tmp_path / "loop", UNLOADABLE["loop"])
    before = snapshot(folder)
    outcome = run_subprocess(["quantize", str(folder), "-o", str(folder / "q.onnx")], 120)
    assert not problems(outcome, before, snapshot(folder)) and outcome.code == 1, outcome.output
    assert "onnxruntime:" not in outcome.output and "Traceback" not in outcome.output, outcome.output
    debug = run_subprocess(["--debug", "quantize", str(folder), "-o", str(folder / "q.onnx")], 120)
    assert debug.code == 1 and "Traceback" in debug.output, debug.output


def test_load_reason_keeps_only_what_went_wrong() -> None:
    raw = (
        "InvalidGraph: [ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model from /x/m.onnx failed:"
        "/onnxruntime_src/onnxruntime/core/graph/model.cc:340 onnxruntime::Model::Model(onnx::ModelProto&&, "
        "const onnxruntime::ModelOptions&) [ONNXRuntimeError] : 10 : INVALID_GRAPH : Cycle detected: a -> a"
    )
    assert load_reason(raw) == "Cycle detected: a -> a"


def _stored_edit(edit: Callable[[dict[str, str]], None]) -> Callable[[Path, Path], None]:
    def apply(src: Path, dst: Path) -> None:
        stored = dict(read_props(src))
        edit(stored)
        rewrite_props(src, dst, stored)

    return apply


def _sidecar_tag(src: Path, dst: Path) -> None:
    sidecar = json.loads((src.parent / "model_hierarchy.json").read_text())
    first = next(iter(sidecar["nodes"]))
    sidecar["nodes"][first]["tag"] = "/Evil"
    (dst.parent / "model_hierarchy.json").write_text(json.dumps(sidecar))


#: Tampering nobody re-signed: each would be carried into the output under a fresh, valid checksum.
TAMPERED: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "task-edited": (
        _stored_edit(lambda s: s.__setitem__(schema.KEY_TASK, "text-classification")),
        "checksum",
    ),
    "config-edited": (
        _stored_edit(lambda s: s.__setitem__(schema.KEY_MODEL_CONFIG, '{"id2label":{"0":"evil"}}')),
        "checksum",
    ),
    "checksum-removed": (
        _stored_edit(lambda s: s.pop(schema.KEY_CHECKSUM)),
        "no 'modelexport.metadata_checksum'",
    ),
    "checksum-garbage": (_stored_edit(lambda s: s.__setitem__(schema.KEY_CHECKSUM, "sha256:0")), "checksum"),
    "manifest-removed": (_stored_edit(lambda s: s.pop(schema.KEY_ENCODING)), "no manifest"),
    "sidecar-tag": (_sidecar_tag, "does not describe model.onnx"),
}


@pytest.mark.regression
@pytest.mark.parametrize("command", ["quantize", "optimize"])
@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_tampered_metadata_is_not_carried(fuzz_source: Path, tmp_path: Path, case: str, command: str) -> None:
    edit, message = TAMPERED[case]
    folder = Path(shutil.copytree(fuzz_source, tmp_path / case))
    edit(fuzz_source / "model.onnx", folder / "model.onnx")
    line = _error([command, str(folder), "-o", str(tmp_path / "out") + "/"], tmp_path)
    assert message in line and str(folder) in line, line
    assert not (tmp_path / "out").exists()


def test_metadata_re_signed_by_its_owner_is_carried(fuzz_source: Path, tmp_path: Path) -> None:
    """The way out the refusal names: ``metadata --set ... --force`` verifies nothing and signs the edit."""
    folder = Path(shutil.copytree(fuzz_source, tmp_path / "m"))
    TAMPERED["task-edited"][0](fuzz_source / "model.onnx", folder / "model.onnx")
    forced = run_inprocess(
        ["metadata", str(folder), "--set", "hf_pipeline_task=image-classification", "--force"], 60
    )
    assert forced.code == 0, forced.output
    done = run_inprocess(["quantize", str(folder), "-o", str(tmp_path / "q") + "/"], 60)
    assert done.code == 0, done.output
    assert read_metadata(tmp_path / "q")[schema.KEY_TASK] == "image-classification"


@pytest.mark.regression
@pytest.mark.parametrize("command", ["quantize", "optimize", "analyze", "validate"])
def test_a_sidecar_linked_from_outside_is_refused(fuzz_source: Path, tmp_path: Path, command: str) -> None:
    """A transform carried the linked file's content into its output's sidecar; inspect read it as the model's."""
    folder = Path(shutil.copytree(fuzz_source, tmp_path / "m"))
    outside = tmp_path / "elsewhere.json"
    (folder / "model_hierarchy.json").rename(outside)
    (folder / "model_hierarchy.json").symlink_to(outside)
    argv = [command, str(folder)] + (
        ["-o", str(tmp_path / "out") + "/"] if command in ("quantize", "optimize") else []
    )
    line = _error(argv, tmp_path)
    assert "symbolic link" in line and str(outside) in line, line


def _npz(**arrays: object) -> Callable[[Path], None]:
    return lambda path: np.savez(path, **arrays)  # type: ignore[arg-type]


#: Data files ``quantize --eval-data`` / ``--calibration-data`` read: file name -> (writer, message).
DATA: dict[str, tuple[Callable[[Path], None], str]] = {
    "latin1.csv": (lambda p: p.write_bytes("text,label\ncaf\xe9,1\n".encode("latin-1")), "not UTF-8"),
    "rank2.npz": (_npz(x=np.zeros((3, 5), np.float32)), "holds examples of shape [5]"),
    "small-images.npz": (_npz(x=np.zeros((3, 1, 5, 5), np.float32)), "takes examples of shape [1, 8, 8]"),
    "scalar.npz": (_npz(x=np.float32(3)), "is a scalar"),
    "strings.npz": (_npz(x=np.array(["a", "b"])), "not numbers"),
    "uneven.npz": (_npz(a=np.zeros((3, 2)), b=np.zeros((2, 2))), "different numbers of examples"),
    "not-a-zip.npz": (lambda p: p.write_bytes(b"PK\x03\x04garbage"), "cannot read as .npz"),
}


@pytest.mark.regression
@pytest.mark.parametrize("option", ["--eval-data", "--calibration-data"])
@pytest.mark.parametrize("name", sorted(DATA))
def test_quantize_data_files_the_model_cannot_take(
    fuzz_source: Path, tmp_path: Path, name: str, option: str
) -> None:
    write, message = DATA[name]
    data = tmp_path / name
    write(data)
    argv = ["quantize", str(fuzz_source), "-o", str(tmp_path / "q") + "/", option, str(data)]
    line = _error([*argv, *(["--mode", "static"] if option == "--calibration-data" else [])], tmp_path)
    assert str(data) in line and message in line, line


#: Integer options of the commands that read a model, with the rest of their argv ({m}: the CNN package,
#: {o}: a new output folder, {img}: a PNG). evaluate's and pipeline's are checked where those commands are.
INT_OPTIONS: dict[str, list[str]] = {
    "--depth": ["analyze", "{m}"],
    "--batch-size": ["infer", "{m}", "--image", "{img}"],
    "--top-k": ["infer", "{m}", "--image", "{img}"],
    "--seed": ["infer", "{m}", "--image", "{img}"],
    "--num-heads": ["optimize", "{m}", "-o", "{o}/", "-O2"],
    "--hidden-size": ["optimize", "{m}", "-o", "{o}/", "-O2"],
    "--runs": ["profile", "{m}", "--warmup", "0"],
    "--warmup": ["profile", "{m}", "--runs", "1"],
    "--calibration-samples": ["quantize", "{m}", "-o", "{o}/"],
    "--eval-samples": ["quantize", "{m}", "-o", "{o}/"],
}
SIGNED = [-1, 0, 2**31, 2**63, 2**64, -(2**63)]


@pytest.mark.regression
@pytest.mark.parametrize("option", sorted(INT_OPTIONS))
def test_signed_integer_options(fuzz_source: Path, fuzz_image: Path, tmp_path: Path, option: str) -> None:
    """Each value is a result or a refusal (click's usage error, exit 2, or a one-line error), within seconds."""
    for value in SIGNED:
        values = {"m": str(fuzz_source), "o": str(tmp_path / f"out{value}"), "img": str(fuzz_image)}
        argv = [a.format(**values) for a in INT_OPTIONS[option]] + [option, str(value)]
        if "--eval-samples" in argv or "--calibration-samples" in argv:
            data = tmp_path / "d.npz"
            np.savez(data, x=np.zeros((2, 1, 8, 8), np.float32))
            argv += ["--eval-data" if option == "--eval-samples" else "--calibration-data", str(data)]
        before = snapshot(tmp_path)
        outcome = run_inprocess(argv, 30)
        found = [p for p in problems(outcome, before, snapshot(tmp_path)) if not p.startswith("exit code 2")]
        assert not found and outcome.code in (0, 1, 2) and outcome.seconds < 20, (argv, outcome.output[-800:])
