"""Each way a command once lost or scattered a user's file, run again: it now does what the user meant or
refuses before touching anything. Plus the rule's own pieces (``modelexport.onnxfile.output``) on plain files:
the form of a path, what counts as ours, the check before the move, and a failed run leaving nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import modelexport
from modelexport.cli.app import main
from modelexport.errors import OutputExistsError, OutputWriteError
from modelexport.onnxfile import (
    PACKAGE_MANIFEST,
    WRITTEN_KEY,
    output_path,
    plan_output,
    read_manifest,
    recorded_files,
    staged_output,
)
from tests.flows.conftest import write_image_folder

CNN = str(Path(__file__).resolve().parents[1] / "models" / "torch_models.py") + ":SmallCNN"


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def cnn_o1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CNN exported with ``--optimize O1``: ``model.onnx``, and ``model_O1.onnx`` as the deployed model."""
    out = tmp_path_factory.mktemp("repro") / "b"
    modelexport.export(CNN, out, input_shape=(2, 1, 8, 8), optimize="O1")
    return out


@pytest.fixture(scope="session")
def text_package(task_export: Any) -> Path:
    """The tiny BERT text classifier's package: model, sidecar, config and tokenizer files."""
    return Path(task_export("seq_cls").output_dir)


# --- the reproductions --------------------------------------------------------------------------------


@pytest.mark.regression
def test_optimize_into_the_input_package_refuses_to_replace_its_model(
    cnn_o1: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``optimize b/ -o b/model.onnx -O2``: b/ means the deployed model_O1.onnx, and b/model.onnx is the
    export's own graph; it was silently replaced. Now refused; with --overwrite (the export recorded it) it is
    replaced, and the input stays."""
    b = shutil.copytree(cnn_o1, tmp_path / "b")
    before = _hashes(b)
    assert main(["optimize", f"{b}/", "-o", str(b / "model.onnx"), "-O2"]) == 1
    err = capsys.readouterr().err
    assert "refusing to replace" in err and "model.onnx" in err and "--overwrite" in err
    assert _hashes(b) == before
    assert main(["optimize", f"{b}/", "-o", str(b / "model.onnx"), "-O2", "--overwrite"]) == 0
    after = _hashes(b)
    assert after["model_O1.onnx"] == before["model_O1.onnx"] and after["model.onnx"] != before["model.onnx"]
    assert "model.onnx" in read_manifest(b)[WRITTEN_KEY]


@pytest.mark.regression
def test_export_into_a_folder_quantize_wrote_refuses_then_replaces_only_with_overwrite(
    text_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``export cnn.py:make_cnn minilm_qdq/``: the quantized model and its tokenizer were deleted ("the earlier
    export's files", but quantize wrote them). Now refused; with --overwrite the earlier package (its recorded
    files) is replaced, and a user's file there stays."""
    qdq = tmp_path / "minilm_qdq"
    modelexport.quantize(text_package, f"{qdq}/", progress=False)
    (qdq / "notes.txt").write_text("mine")
    before = _hashes(qdq)
    assert {"tokenizer.json", "config.json", "model.onnx"} <= set(before)
    assert main(["export", CNN, f"{qdq}/", "--input-shape", "2,1,8,8"]) == 1
    assert "this run did not create them" in capsys.readouterr().err and _hashes(qdq) == before
    assert main(["export", CNN, f"{qdq}/", "--input-shape", "2,1,8,8", "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "removed those this export does not write" in out and "tokenizer.json" in out
    assert (qdq / "notes.txt").read_text() == "mine" and not (qdq / "tokenizer.json").exists()
    assert set(read_manifest(qdq)[WRITTEN_KEY]) == {
        "export_metadata.json",
        "model.onnx",
        "model_hierarchy.json",
    }


@pytest.mark.regression
@pytest.mark.parametrize("command", ["optimize", "quantize"])
def test_a_folder_output_is_a_folder_and_nothing_lands_in_the_working_directory(
    command: str,
    text_package: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``optimize minilm/ -o minilm_o2/ -O2`` wrote an extensionless file ``minilm_o2`` and copied config.json
    and the tokenizer loose into the working directory; ``quantize b/model.onnx -o int8dir/`` too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    source = str(text_package) + "/" if command == "optimize" else str(text_package / "model.onnx")
    level = ["-O2"] if command == "optimize" else []
    assert main([command, source, "-o", "out_dir/", *level]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "out_dir"]
    files = {p.name for p in (tmp_path / "out_dir").iterdir()}
    assert {"model.onnx", "model_hierarchy.json", "config.json", "tokenizer.json", PACKAGE_MANIFEST} <= files
    assert modelexport.pipeline(model=str(tmp_path / "out_dir"))("a fine day")[0]["label"]


@pytest.mark.regression
@pytest.mark.parametrize(
    "argv",
    [
        ["extract", "{m}", "-m", "bert.encoder.layer.0", "-o", "{m}"],
        ["analyze", "{m}", "-o", "{m}"],
        ["compare", "{m}", "{m}", "-o", "{m}"],
        ["profile", "{m}", "--runs", "1", "-o", "{m}"],
        ["report", "{m}", "-o", "{m}"],
        ["infer", "{m}", "--data", "{d}", "--output", "{d}"],
    ],
    ids=["extract", "analyze", "compare", "profile", "report", "infer-data"],
)
@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
def test_no_command_writes_over_what_it_reads(
    argv: list[str], overwrite: bool, text_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``extract x.onnx -m TAG -o x.onnx``, ``analyze``/``compare``/``profile -o x.onnx`` overwrote the model
    they read. Refused, with or without --overwrite, before any work."""
    pkg = shutil.copytree(text_package, tmp_path / "pkg")
    (pkg / "texts.csv").write_text("sentence\ngood\n")
    before = _hashes(pkg)
    args = [a.format(m=pkg / "model.onnx", d=pkg / "texts.csv") for a in argv]
    assert main(args + (["--overwrite"] if overwrite else [])) == 1
    assert "is an input of this run" in capsys.readouterr().err
    assert _hashes(pkg) == before


@pytest.mark.regression
def test_pipeline_bare_model_name_never_scatters_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python pipeline.py --output_model classifier.onnx`` wrote the package (config, processor, metadata,
    report) into the working directory over same-named files. In a folder with other files it is refused before
    any work (no training), naming the way out."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipeline_report.json").write_text('{"mine": 1}')
    (tmp_path / "train.py").write_text("print('mine')\n")
    before = _hashes(tmp_path)
    assert main(["pipeline", "--output_model", "classifier.onnx", "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert "would be scattered" in err and "classifier/" in err
    assert _hashes(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "pipeline_report.json",
        "train.py",
    ]


@pytest.mark.regression
def test_pipeline_bare_model_name_in_an_empty_folder_writes_the_package_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's own form in a folder of its own: the model with its package beside it, recorded as ours, so
    the same command with --overwrite runs again."""
    write_image_folder(tmp_path / "data")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    args = ["pipeline", "--dataset_path", str(tmp_path / "data"), "--output_model", "classifier.onnx"]
    args += [
        "--epochs",
        "1",
        "--iterations",
        "1",
        "--tta",
        "false",
        "--ttt",
        "false",
        "--optimize_policy",
        "false",
    ]
    assert main(args) == 0
    files = {p.name for p in run.iterdir()}
    assert {"classifier.onnx", "classifier_dynamic.onnx", "pipeline_report.json", PACKAGE_MANIFEST} <= files
    assert recorded_files(run) >= files
    assert main(args) == 1
    assert main([*args, "--overwrite"]) == 0


# --- the rule's pieces, on plain files -----------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("output", "bare_is_folder", "expected"),
    [
        ("out/", False, ("out/x.json", True)),
        ("out", True, ("out/x.json", True)),
        ("out", False, ("out", False)),
        ("out.onnx", True, ("out.onnx", False)),
        ("out.ONNX", True, ("out.ONNX", False)),
        ("existing", False, ("existing/x.json", True)),
    ],
)
def test_the_form_of_an_output_path(
    output: str,
    bare_is_folder: bool,
    expected: tuple[str, bool],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    path, is_folder = output_path(output, "x.json", bare_is_folder=bare_is_folder)
    assert (str(path), is_folder) == expected


@pytest.mark.smoke
def test_overwrite_replaces_only_the_named_file_and_recorded_ones(tmp_path: Path) -> None:
    """In a folder, --overwrite replaces only what a manifest records; a file the user names (with its sidecar)
    is theirs to replace; package files never go beside a model in a folder of other files."""
    (tmp_path / "model.onnx").write_bytes(b"old")
    (tmp_path / "model_hierarchy.json").write_text("{}")
    (tmp_path / "config.json").write_text("{}")
    folder = {"output": f"{tmp_path}/", "default_name": "model.onnx", "package": ["config.json"]}
    with pytest.raises(OutputExistsError, match="this run did not create them"):
        plan_output(**folder, package_folder=True)
    with pytest.raises(OutputExistsError, match=r"3 files in .*: no modelexport run recorded them"):
        plan_output(**folder, package_folder=True, overwrite=True)
    named = plan_output(tmp_path / "model.onnx", "model.onnx", overwrite=True)
    assert {
        "model.onnx",
        "model_hierarchy.json",
    } <= named.replaceable and "config.json" not in named.replaceable
    with pytest.raises(OutputExistsError, match="would be scattered"):
        plan_output(tmp_path / "model.onnx", "model.onnx", package=["config.json"], overwrite=True)
    record = {WRITTEN_KEY: ["model.onnx", "model_hierarchy.json", "config.json"]}
    (tmp_path / PACKAGE_MANIFEST).write_text(json.dumps(record))
    plan = plan_output(**folder, package_folder=True, overwrite=True)
    assert {"model.onnx", "model_hierarchy.json", "config.json", PACKAGE_MANIFEST} <= plan.replaceable


@pytest.mark.smoke
def test_a_foreign_manifest_and_a_transforms_sidecar_record_nothing(tmp_path: Path) -> None:
    """Only our manifests and an export's own sidecar say which files are ours: a sidecar a transform carried
    over names the source's folder, not this one."""
    (tmp_path / PACKAGE_MANIFEST).write_text('{"name": "someone else\'s"}')
    side = {"export": {"package_files": ["model.onnx", "config.json"]}, "nodes": {}, "tags": {}}
    (tmp_path / "q_hierarchy.json").write_text(json.dumps({**side, "transforms": [{"kind": "quantize"}]}))
    assert recorded_files(tmp_path) == set()
    (tmp_path / "model_hierarchy.json").write_text(json.dumps(side))
    assert recorded_files(tmp_path) == {"model.onnx", "config.json", "model_hierarchy.json"}


@pytest.mark.smoke
def test_a_file_that_appears_during_the_run_is_not_replaced(tmp_path: Path) -> None:
    plan = plan_output(f"{tmp_path}/pkg/", "model.onnx", package=["config.json"], package_folder=True)
    with pytest.raises(OutputExistsError, match="config.json"):
        with staged_output(plan) as stage:
            (stage.path / "model.onnx").write_bytes(b"new")
            (stage.path / "config.json").write_text("{}")
            (tmp_path / "pkg" / "config.json").write_text("the user's, written meanwhile")
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["config.json"]
    assert (tmp_path / "pkg" / "config.json").read_text() == "the user's, written meanwhile"


@pytest.mark.smoke
def test_a_failed_run_leaves_no_folder_and_no_staging(tmp_path: Path) -> None:
    plan = plan_output(tmp_path / "a" / "b" / "model.onnx", "model.onnx")
    with pytest.raises(RuntimeError, match="boom"):
        with staged_output(plan) as stage:
            (stage.path / "model.onnx").write_bytes(b"half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    plan = plan_output(tmp_path / "kept" / "model.onnx", "model.onnx")
    with pytest.raises(RuntimeError), staged_output(plan):
        raise RuntimeError("boom")
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []


@pytest.mark.smoke
def test_refusals_are_typed_builtins_too(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        plan_output(tmp_path / "f", "x.json")
    with pytest.raises(OutputWriteError, match="is a file, not a folder"):
        plan_output(tmp_path / "f" / "x.json", "x.json")
    with pytest.raises(OutputWriteError, match="empty"):
        plan_output("", "x.json")


@pytest.mark.regression
def test_a_package_folder_records_its_files_so_overwrite_can_replace_them(
    cnn_o1: Path, tmp_path: Path
) -> None:
    """A lone .onnx quantized into a folder: the folder gets a manifest (the graph has no package of its own),
    so running again needs --overwrite and then replaces exactly those files; a note of the user's stays."""
    shutil.copy(cnn_o1 / "model.onnx", tmp_path / "cnn.onnx")
    modelexport.quantize(tmp_path / "cnn.onnx", f"{tmp_path}/q/", progress=False)
    assert set(read_manifest(tmp_path / "q")[WRITTEN_KEY]) == {"model.onnx", PACKAGE_MANIFEST}
    (tmp_path / "q" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="this run did not create them"):
        modelexport.quantize(tmp_path / "cnn.onnx", f"{tmp_path}/q/", progress=False)
    modelexport.quantize(tmp_path / "cnn.onnx", f"{tmp_path}/q/", progress=False, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == [PACKAGE_MANIFEST, "model.onnx", "notes.txt"]
