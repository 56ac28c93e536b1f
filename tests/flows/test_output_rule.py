"""The one output rule (``modelexport.onnxfile.output``), command by command: every command that writes x every
place a user points it at, through the CLI on real exports of tiny models.

Each case hashes every file under the test folder before and after: a user's file (and every input) must be
byte for byte what it was, the outputs must be where the rule says and nowhere else (no loose files, no staging
left behind), and a refusal must change nothing and say why in one line with a hint, exit 1, no traceback.
The only files that may change are those of a package an earlier run of ours recorded, with ``--overwrite``.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import modelexport
from modelexport.cli.app import main
from tests.flows.conftest import write_image_folder
from tests.helpers import message_lines

MODELS_PY = Path(__file__).resolve().parents[1] / "models" / "torch_models.py"
USER_NOTE = b"my notes, not a model's\n"
USER_MODEL = b"my own model.onnx, never to be replaced\n"
USER_CONFIG = b'{"mine": true}\n'


@pytest.fixture(scope="session")
def rule_root(task_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What every case copies: ``src/`` (the tiny BERT text classifier's package, with its config and
    tokenizer, a CSV of texts, a folder of images, the torch models file) and ``ours/`` (a package that
    ``quantize`` wrote, so ours by its manifest, with a user's note added)."""
    root = tmp_path_factory.mktemp("output_rule")
    src = root / "src"
    shutil.copytree(task_export("seq_cls").output_dir, src)
    shutil.copy(MODELS_PY, src / "models.py")
    (src / "texts.csv").write_text("sentence,label\nthe movie is good,1\nterrible city,0\ni love it,1\n")
    write_image_folder(src / "digits")
    modelexport.quantize(src / "model.onnx", f"{root / 'ours'}/", progress=False)
    (root / "ours" / "notes.txt").write_bytes(USER_NOTE)
    return root


@dataclass(frozen=True)
class Command:
    """One command that writes: its arguments for an output, and what it writes."""

    name: str
    argv: Callable[[Path, str], list[str]]
    #: The suffix of its file form (``-o out.onnx``, ``-o out.json``).
    suffix: str
    #: Its file in a named folder.
    default: str
    #: It writes a model package: a folder output is the package (another model's files are in the way)
    #: and a model file takes its package files beside it (never scattered among a user's files).
    package: bool
    #: The input a user may name as the output.
    input: str = "src/model.onnx"


_PIPELINE = [
    "--model_type",
    "image_classifier",
    "--epochs",
    "1",
    "--iterations",
    "1",
    "--quantize",
    "none",
    "--tta",
    "false",
    "--ttt",
    "false",
    "--optimize_policy",
    "false",
]

COMMANDS = [
    Command(
        "export",
        lambda s, o: ["export", f"{s}/models.py:SmallCNN", o, "--input-shape", "2,1,8,8"],
        ".onnx",
        "model.onnx",
        True,
        "src/models.py",
    ),
    Command("quantize", lambda s, o: ["quantize", f"{s}/model.onnx", "-o", o], ".onnx", "model.onnx", True),
    Command(
        "optimize",
        lambda s, o: ["optimize", f"{s}/", "-o", o, "--level", "basic"],
        ".onnx",
        "model.onnx",
        True,
    ),
    Command(
        "extract",
        lambda s, o: ["extract", f"{s}/model.onnx", "-m", "bert.encoder.layer.0", "-o", o],
        ".onnx",
        "bert.encoder.layer.0.onnx",
        False,
    ),
    Command("report", lambda s, o: ["report", f"{s}/model.onnx", "-o", o], ".html", "report.html", False),
    Command("analyze", lambda s, o: ["analyze", f"{s}/model.onnx", "-o", o], ".json", "analyze.txt", False),
    Command(
        "compare",
        lambda s, o: ["compare", f"{s}/model.onnx", f"{s}/model.onnx", "-o", o],
        ".md",
        "compare.txt",
        False,
    ),
    Command(
        "profile",
        lambda s, o: ["profile", f"{s}/model.onnx", "--runs", "1", "--warmup", "0", "-o", o],
        ".json",
        "profile.txt",
        False,
    ),
    Command(
        "infer",
        lambda s, o: ["infer", f"{s}/", "--data", f"{s}/texts.csv", "--output", o],
        ".jsonl",
        "predictions.parquet",
        False,
    ),
    Command(
        "pipeline",
        lambda s, o: ["pipeline", "--dataset_path", f"{s}/digits", "--output_model", o, *_PIPELINE],
        ".onnx",
        "model.onnx",
        True,
        "src/digits",
    ),
]


@dataclass(frozen=True)
class Outcome:
    """What a case must do: write ``main`` (relative to the test folder), or refuse with ``refused`` in the
    message; ``mutable``: the folder whose recorded files may change (an earlier package of ours)."""

    main: str | None = None
    refused: str | None = None
    mutable: str | None = None


def _user_folder(root: Path) -> None:
    user = root / "user"
    user.mkdir()
    (user / "notes.txt").write_bytes(USER_NOTE)
    (user / "model.onnx").write_bytes(USER_MODEL)
    (user / "config.json").write_bytes(USER_CONFIG)


def _scenario(name: str, root: Path, rule_root: Path, command: Command) -> tuple[str, Outcome]:
    """Set up the place ``name`` and return (the output argument, the outcome the rule promises)."""
    if name == "new file":
        return f"{root}/new/out{command.suffix}", Outcome(f"new/out{command.suffix}")
    if name == "new folder/":
        return f"{root}/new/", Outcome(f"new/{command.default}")
    if name == "empty folder":
        (root / "empty").mkdir()
        return str(root / "empty"), Outcome(f"empty/{command.default}")
    if name.startswith("user's folder"):
        _user_folder(root)
        if (
            command.package
        ):  # the user's model.onnx and config.json are in the way, with or without --overwrite
            return str(root / "user"), Outcome(refused="refusing to replace")
        return str(root / "user"), Outcome(f"user/{command.default}")
    if name.startswith("our folder"):
        shutil.copytree(rule_root / "ours", root / "ours")
        if command.package and "--overwrite" not in name:
            return str(root / "ours"), Outcome(refused="this run did not create them")
        return str(root / "ours"), Outcome(f"ours/{command.default}", mutable="ours")
    if name.startswith("the input"):
        return str(root / command.input), Outcome(refused="is an input of this run")
    assert name == "bare name in the working directory"
    (root / "notes.txt").write_bytes(USER_NOTE)
    if command.package:
        return f"out{command.suffix}", Outcome(refused="would be scattered")
    return f"out{command.suffix}", Outcome(f"out{command.suffix}")


SCENARIOS = [
    "new file",
    "new folder/",
    "empty folder",
    "user's folder",
    "user's folder --overwrite",
    "our folder",
    "our folder --overwrite",
    "the input",
    "the input --overwrite",
    "bare name in the working directory",
]


def _cases() -> list[Any]:
    return [pytest.param(c, s, id=f"{c.name}-{s}") for c in COMMANDS for s in SCENARIOS]


def _snapshot(root: Path) -> dict[str, str | None]:
    """Every file (its sha256) and folder (None) under ``root``, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def _recorded(folder: Path) -> set[str]:
    from modelexport.onnxfile import recorded_files

    return recorded_files(folder)


def _check_refusal(
    before: dict[str, str | None], after: dict[str, str | None], err: str, message: str
) -> None:
    assert after == before, "a refused run changed the disk"
    lines = message_lines(err)
    assert "Traceback" not in err
    error = next(line for line in lines if line.startswith("Error: "))
    assert "refusing" in error and message in error, error
    assert lines[lines.index(error) + 1].startswith("Hint: ")


def _check_written(
    root: Path, before: dict[str, str | None], after: dict[str, str | None], outcome: Outcome, ours: set[str]
) -> None:
    assert outcome.main is not None
    main_file = root / outcome.main
    assert main_file.is_file() and main_file.stat().st_size > 0, f"{outcome.main} was not written"
    for (
        rel,
        digest,
    ) in before.items():  # every file that was there is unchanged, but an earlier package of ours
        if after.get(rel) != digest:
            assert outcome.mutable and Path(rel).parent == Path(outcome.mutable) and Path(rel).name in ours, (
                f"{rel} changed"
            )
    for rel in set(after) - set(before):  # new files only in the output's folder (no loose files, no staging)
        assert Path(rel).parent == Path(outcome.main).parent or rel == str(Path(outcome.main).parent), (
            f"{rel} was written outside {Path(outcome.main).parent}"
        )


@pytest.mark.parametrize(("command", "scenario"), _cases())
def test_every_writing_command_follows_the_one_output_rule(
    command: Command,
    scenario: str,
    rule_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(rule_root / "src", tmp_path / "src")
    output, outcome = _scenario(scenario, tmp_path, rule_root, command)
    ours = _recorded(tmp_path / "ours") - {"notes.txt"}
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    argv = command.argv(tmp_path / "src", output) + (["--overwrite"] if "--overwrite" in scenario else [])
    code = main(argv)
    err = capsys.readouterr().err
    after = _snapshot(tmp_path)
    if outcome.refused:
        assert code == 1, err
        _check_refusal(before, after, err, outcome.refused)
    else:
        assert code == 0, err
        _check_written(tmp_path, before, after, outcome, ours)
    assert (tmp_path / "src" / "model.onnx").read_bytes() == (rule_root / "src" / "model.onnx").read_bytes()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_refusal_comes_before_any_work(
    command: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inputs are not even read: on broken inputs a refused run says it refuses, not that they are broken."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("model.onnx", "models.py", "texts.csv", "digits"):
        (src / name).write_bytes(b"\x00 not what its name says\n")
    (tmp_path / f"out{command.suffix}").write_bytes(USER_NOTE)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    assert main(command.argv(src, str(tmp_path / f"out{command.suffix}"))) == 1
    _check_refusal(before, _snapshot(tmp_path), capsys.readouterr().err, "this run did not create it")
