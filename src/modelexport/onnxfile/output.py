"""Where a command writes: the one output rule of every command that writes files.

``export``, ``quantize``, ``optimize``, ``extract``, ``report``, ``pipeline``, ``infer --output``, ``analyze`` /
``compare`` / ``profile -o`` and ``--node-data`` (and their Python functions) plan their output with
:func:`plan_output` before any work, then write through :func:`staged_output` (several files) or
:func:`write_output_text` (one file).

**Form.** ``PATH/`` (a trailing separator) or an existing folder names a folder, created if missing: the
command's file goes in under its default name (``model.onnx`` for a model). ``FILE.onnx`` names that model
file: its sidecar, its external data and the package files it needs (config, processor files,
``export_metadata.json``) go beside it. For a command that writes a model any other path is a folder too
(``export MODEL out``); for a report it is the report file.

**Refused before any work** (:class:`~modelexport.errors.OutputExistsError`, one line naming the files):

- an output that is one of the run's inputs (the model, its sidecar or weights, a dataset), or a package
  folder that is an input or holds an input model, always;
- an output that would replace an existing file, unless ``overwrite``. With ``overwrite`` only the file the
  user named (``-o FILE``, with its sidecar and external data) and files an earlier run of ours recorded as
  its own in the folder's manifest (``export_metadata.json``: ``written``, and an export's file lists) are
  replaced; any other file never is (in a named folder, a file under our default name is not the user's to
  give away: only a record makes it replaceable);
- package files beside a model file in a folder that holds other files than the run's inputs (a bare
  ``NAME.onnx`` in a working directory): they would be scattered among the user's files; name a folder for
  the package instead. The run's own dataset there is no obstacle (the specification's
  ``--dataset_path train_data.csv --output_model classifier.onnx``).

A package folder always gets a record of its files (a manifest, or an export's own sidecar). Written with
``overwrite`` it replaces the earlier package there: the files it recorded that the new run does not write
again are removed (never an input, never a file no record lists).

**Atomic.** The files are staged in a hidden folder inside the output folder and renamed into place only
when the whole run succeeded, the main file last; a failure leaves the folder as it was (and removes a
folder the run created), and nothing is written outside the named output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import read_json_object, write_json, write_text
from ..errors import OnnxFileError, OutputExistsError, OutputWriteError
from .resolve import COMPONENTS_KEY, DEPLOYED_KEY, PACKAGE_MANIFEST, WRITTEN_KEY, folder_model, read_manifest
from .sidecar import SIDECAR_SUFFIX, sidecar_path_for

__all__ = [
    "MODEL_SUFFIX",
    "PROCESSOR_FILES",
    "PACKAGE_FILES",
    "GRAPH_FILE_SUFFIXES",
    "OutputPlan",
    "Staging",
    "output_path",
    "own_files",
    "is_package_file",
    "recorded_files",
    "plan_output",
    "staged_output",
    "write_output_text",
]

MODEL_SUFFIX = ".onnx"
#: Processor files transformers reads from a model folder (besides a tokenizer's own vocab files).
PROCESSOR_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "added_tokens.json",
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.jinja",
)
#: The files of a package besides its graphs: the configs (Optimum reads config.json, onnxruntime-genai
#: genai_config.json) and the processor files.
PACKAGE_FILES = (
    "config.json",
    "generation_config.json",
    "genai_config.json",
    *PROCESSOR_FILES,
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)
#: Names that belong to one graph: the graph, its external data, its sidecar.
GRAPH_FILE_SUFFIXES = (MODEL_SUFFIX, ".onnx.data", ".onnx_data", SIDECAR_SUFFIX)
#: Keys only our manifests have: a manifest without any is someone else's file.
_MANIFEST_KEYS = ("metadata", "files", WRITTEN_KEY, COMPONENTS_KEY, DEPLOYED_KEY)
_STAGING_PREFIX = ".modelexport-"
_SHOWN = 6


def output_path(
    output: str | os.PathLike[str], default_name: str, *, bare_is_folder: bool = False
) -> tuple[Path, bool]:
    """(the main file a run writes, whether ``output`` names a folder) by the form rule above.

    ``bare_is_folder``: the command writes a model, so a path not ending in ``.onnx`` is a folder.
    """
    text = os.fspath(output)
    if not text.strip():
        raise OutputWriteError("the output path is empty", hint="name a file or a folder (-o PATH)")
    path = Path(text)
    folder = (
        text.endswith(("/", os.sep))
        or path.is_dir()
        or (bare_is_folder and path.suffix.lower() != MODEL_SUFFIX)
    )
    return (path / default_name, True) if folder else (path, False)


def own_files(name: str) -> tuple[str, ...]:
    """``name`` and the files that belong to it: a model's external data and its sidecar."""
    if not name.endswith(MODEL_SUFFIX):
        return (name,)
    return (name, f"{name}.data", sidecar_path_for(name).name)


def is_package_file(name: str) -> bool:
    """Whether ``name`` is a file of a model package (a graph, its sidecar, config, processor, manifest)."""
    return name.endswith(GRAPH_FILE_SUFFIXES) or name in PACKAGE_FILES or name == PACKAGE_MANIFEST


def _listed(value: object) -> set[str]:
    return {str(n) for n in value} if isinstance(value, list) else set()


def _our_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest when one of our runs wrote it; None when absent, broken or someone else's."""
    try:
        manifest = read_manifest(folder)
    except OnnxFileError:
        return None
    return manifest if any(k in manifest for k in _MANIFEST_KEYS) else None


def _sidecar_files(sidecar: Path) -> set[str]:
    """The files an export recorded in its sidecar's settings (the record before manifests had one). Only an
    export's own sidecar counts: a transform carries the source's settings into its sidecar (``transforms``),
    and their file list names the source's folder, not this one."""
    try:
        data = read_json_object(sidecar, OnnxFileError, "")
    except OnnxFileError:
        return set()
    export = data.get("export") if isinstance(data.get("export"), dict) else {}
    listed = _listed(export.get("package_files"))
    model = sidecar.name.removesuffix(SIDECAR_SUFFIX) + MODEL_SUFFIX
    if data.get("transforms") or model not in listed:
        return set()
    return listed | {sidecar.name}


def recorded_files(folder: str | os.PathLike[str]) -> set[str]:
    """Names in ``folder`` that runs of ours recorded as their own: the manifest's ``written`` and ``files``
    (and the manifest itself), and the file lists that exports keep in their sidecars."""
    folder = Path(folder)
    if not folder.is_dir():
        return set()
    names: set[str] = set()
    manifest = _our_manifest(folder)
    if manifest is not None:
        names |= _listed(manifest.get(WRITTEN_KEY)) | _listed(manifest.get("files")) | {PACKAGE_MANIFEST}
    for sidecar in folder.glob(f"*{SIDECAR_SUFFIX}"):
        names |= _sidecar_files(sidecar)
    return names


def _entries(folder: Path) -> set[str]:
    """The names in ``folder`` (files and folders), without staging folders of runs in progress."""
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if not p.name.startswith(_STAGING_PREFIX)}


def _input_files(inputs: Iterable[str | os.PathLike[str] | None]) -> frozenset[Path]:
    """The resolved paths of the run's inputs, with each model's own files (sidecar, external data); a
    package folder brings the model it means."""
    found: set[Path] = set()
    for item in inputs:
        if item is None or not os.fspath(item):
            continue
        path = Path(item)
        if not path.exists():
            continue
        found.add(path.resolve())
        model = folder_model(path) if path.is_dir() else path
        if model is not None and model.name.endswith(MODEL_SUFFIX):
            found |= {
                (model.parent / n).resolve() for n in own_files(model.name) if (model.parent / n).exists()
            }
    return frozenset(found)


def _show(folder: Path, names: Iterable[str]) -> str:
    """``out/model.onnx``, or ``3 files in out (a, b, c)``: the files named in a one-line message."""
    names = sorted(names)
    if len(names) == 1:
        return str(folder / names[0])
    shown = ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
    return f"{len(names)} files in {folder} ({shown})"


@dataclass(frozen=True)
class OutputPlan:
    """Where a run writes, checked against the disk before any work (:func:`plan_output`)."""

    #: The main file: the model (or report) the user named, or its default name in the named folder.
    path: Path
    #: The user named a folder.
    is_folder: bool
    #: The folder is the package (a model command's folder output): ``overwrite`` replaces the package there.
    package_folder: bool
    overwrite: bool
    #: Existing names the run may replace (empty without ``overwrite``).
    replaceable: frozenset[str]
    #: Names earlier runs of ours recorded in the folder (and present there).
    recorded: frozenset[str]
    #: The run's inputs (resolved): never replaced, never removed.
    inputs: frozenset[Path]
    #: Files besides the main file's own may be written (the folder holds nothing else of the user's).
    package_ok: bool
    #: The package files the run said it writes beside the main file.
    package: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def name(self) -> str:
        return self.path.name


def _refuse_inputs(path: Path, names: set[str], inputs: frozenset[Path], package_folder: bool) -> None:
    folder = path.parent
    taken = sorted(n for n in names if (folder / n).resolve() in inputs)
    if path.name in taken:  # the output is the input: its sidecar and weights need no mention
        taken = [path.name]
    if taken:
        raise OutputExistsError(
            f"refusing to write {_show(folder, taken)}: "
            + ("it is an input" if len(taken) == 1 else "they are inputs")
            + " of this run",
            hint="choose another output: a new file, or a new or empty folder",
        )
    here = folder.resolve()
    models = [p for p in inputs if p == here or (p.parent == here and p.name.endswith(GRAPH_FILE_SUFFIXES))]
    held = sorted(p.name for p in models) if package_folder else []
    if held:
        raise OutputExistsError(
            f"refusing to write a package into {folder}: it is or holds this run's input {', '.join(held)}",
            hint=f"name another folder, or a new file in this one (-o {folder / 'NAME.onnx'})",
        )


def _others(folder: Path, names: set[str], inputs: frozenset[Path]) -> list[str]:
    """The user's files in ``folder`` a package would be scattered among: every file but the run's own
    inputs (``python pipeline.py --dataset_path train.csv --output_model clf.onnx`` beside its data)."""
    return sorted(n for n in names if (folder / n).is_file() and (folder / n).resolve() not in inputs)


def _refuse_scatter(path: Path, package: Iterable[str], others: list[str]) -> None:
    raise OutputExistsError(
        f"refusing to write {path.name} with its package files ({', '.join(sorted(package))}) into "
        f"{path.parent}, which holds other files ({_show(path.parent, others)}): they would be scattered there",
        hint=f"name a folder for the package (-o {path.with_suffix('')}{os.sep}), or a file in a new or empty folder",
    )


def _refuse_replace(folder: Path, conflicts: set[str], overwrite: bool) -> None:
    them = "it" if len(conflicts) == 1 else "them"
    if not overwrite:
        raise OutputExistsError(
            f"refusing to replace {_show(folder, conflicts)}: this run did not create {them}"
        )
    raise OutputExistsError(
        f"refusing to replace {_show(folder, conflicts)}: no modelexport run recorded {them} as its own, "
        f"so --overwrite leaves {them} alone",
        hint=f"move {them} away, or write to a new or empty folder",
    )


def _check_target(output: str | os.PathLike[str], path: Path, inputs: frozenset[Path], whole: bool) -> None:
    """``-o INPUT`` is refused first, whatever its form; then a file in the way of a folder, a folder in the way
    of a file."""
    given = Path(output).resolve()
    if given in inputs and (given.is_file() or whole):
        raise OutputExistsError(
            f"refusing to write {output}: it is an input of this run",
            hint="choose another output: a new file, or a new or empty folder",
        )
    if path.parent.exists() and not path.parent.is_dir():
        raise OutputWriteError(f"{path.parent} is a file, not a folder", hint="choose another output path")
    if path.is_dir():
        raise OutputExistsError(f"{path} is a folder", hint="name a file, or another folder")


def _conflicts(folder: Path, present: set[str], recorded: set[str], names: set[str], whole: bool) -> set[str]:
    """The existing names the run would replace; a package folder's whole earlier package, and another
    model's files, are in the way too."""
    conflicts = present & names
    if whole:
        conflicts |= {n for n in present if n in recorded or is_package_file(n)}
    dirs = sorted(n for n in conflicts if (folder / n).is_dir() and not (folder / n).is_symlink())
    if dirs:
        raise OutputExistsError(f"refusing to replace the folder {_show(folder, dirs)}")
    return conflicts


def plan_output(
    output: str | os.PathLike[str],
    default_name: str,
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    package: Iterable[str] = (),
    bare_is_folder: bool = False,
    package_folder: bool = False,
    overwrite: bool = False,
) -> OutputPlan:
    """Check ``output`` against the one rule (module docstring) before any work; refuse with
    :class:`OutputExistsError`, or return the plan :func:`staged_output` writes by.

    ``default_name``: the main file's name in a named folder. ``inputs``: what the run reads (models,
    datasets). ``package``: names of the files the run writes beside the main file besides its own
    (config, processor files, manifest, other graphs). ``bare_is_folder``: the command writes a model
    (see :func:`output_path`). ``package_folder``: a folder output is the model's package (another model's
    files there are refused; ``overwrite`` replaces the earlier package).
    """
    path, is_folder = output_path(output, default_name, bare_is_folder=bare_is_folder)
    folder, package, whole = path.parent, tuple(package), is_folder and package_folder
    ins = _input_files(inputs)
    _check_target(output, path, ins, whole)
    own = set(own_files(path.name))
    _refuse_inputs(path, own | set(package), ins, whole)
    present = _entries(folder)
    recorded = recorded_files(folder) & present
    conflicts = _conflicts(folder, present, recorded, own | set(package), whole)
    others = _others(folder, present - recorded - own, ins)
    if package and not is_folder and others:
        _refuse_scatter(path, package, others)
    if conflicts and not overwrite:
        _refuse_replace(folder, conflicts, overwrite=False)
    named = (
        set() if is_folder else own
    )  # a file the user named (not one we named in their folder) is theirs to replace
    if conflicts - recorded - named:
        _refuse_replace(folder, conflicts - recorded - named, overwrite=True)
    return OutputPlan(
        path=path,
        is_folder=is_folder,
        package_folder=whole,
        overwrite=overwrite,
        replaceable=frozenset((recorded | named) if overwrite else ()),
        recorded=frozenset(recorded),
        inputs=ins,
        package_ok=is_folder or not others,
        package=package,
    )


@dataclass
class Staging:
    """The staging folder of a run (``path``) and, once committed, what happened in the output folder."""

    path: Path
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def _make_folder(folder: Path) -> Path | None:
    """Create ``folder`` (and its missing parents); the topmost folder created, or None."""
    missing = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputWriteError(f"cannot create {folder}: {_blocker(folder) or exc.strerror or exc}") from exc
    return missing


def _blocker(folder: Path) -> str | None:
    """What stands where a folder of the output path should be: a file, or a link to nothing."""
    for path in reversed([folder, *folder.parents]):
        if path.is_symlink() and not path.exists():
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
        if path.exists() and not path.is_dir():
            return f"{path} is a file, not a folder"
    return None


def _remove_created(folder: Path, top: Path) -> None:
    """Remove the empty folders a failed run created, from ``folder`` up to ``top``."""
    for path in [folder, *folder.parents]:
        try:
            path.rmdir()
        except OSError:
            return
        if path == top:
            return


def _check_commit(plan: OutputPlan, names: list[str]) -> None:
    """The plan still holds: nothing staged replaces a file it may not (a file that appeared since, or a
    name the run could not predict), and package files go only where the plan allows them."""
    present = _entries(plan.folder)
    clash = {n for n in names if n in present and n not in plan.replaceable}
    clash |= {n for n in names if (plan.folder / n).resolve() in plan.inputs}
    if clash:
        _refuse_replace(plan.folder, clash, plan.overwrite)
    own = set(own_files(plan.name))
    extra = sorted(set(names) - own)
    if extra and not plan.package_ok:
        others = _others(plan.folder, present - plan.recorded - own, plan.inputs)
        _refuse_scatter(plan.path, extra, others)


def _record(plan: OutputPlan, staging: Path, names: list[str], removed: list[str]) -> None:
    """Record the files this run wrote in the folder's manifest: the staged one, or ours already there
    (merged: every entry kept), or a new one in a package folder whose files no staged record lists. A model
    file beside other files, or a report, has no package to record them in: only the file named may be
    replaced there."""
    staged = staging / PACKAGE_MANIFEST
    if staged.is_file():
        manifest = read_manifest(staging)
    elif PACKAGE_MANIFEST in plan.recorded and PACKAGE_MANIFEST not in removed:
        manifest = _our_manifest(plan.folder) or {}
        names.append(PACKAGE_MANIFEST)
    elif plan.package_folder and not set(names) <= recorded_files(staging):  # what makes its files ours
        manifest = {}  # (an export's own sidecar already lists them: --no-embed-metadata writes no manifest)
        names.append(PACKAGE_MANIFEST)
    else:
        return
    kept = (plan.recorded | _listed(manifest.get(WRITTEN_KEY))) - set(removed)
    manifest[WRITTEN_KEY] = sorted(kept | set(names) | {PACKAGE_MANIFEST})
    write_json(staged, manifest)


def _move_in(plan: OutputPlan, staging: Path, names: list[str]) -> None:
    """Rename the staged files into the folder, the main file last. An old main file is set aside first (a
    new sidecar never sits beside it), and put back if a rename fails."""
    main, aside = plan.name, staging / f"{_STAGING_PREFIX}old"
    replacing = main in names and (plan.folder / main).is_file()
    try:
        if replacing:
            os.replace(plan.folder / main, aside)
        for name in [n for n in names if n != main] + ([main] if main in names else []):
            os.replace(staging / name, plan.folder / name)
    except OSError as exc:
        if replacing and aside.exists() and not (plan.folder / main).exists():
            os.replace(aside, plan.folder / main)
        raise OutputWriteError(f"cannot write to {plan.folder}: {exc.strerror or exc}") from exc


def _commit(plan: OutputPlan, stage: Staging) -> None:
    staging = stage.path
    names = sorted(p.name for p in staging.iterdir())
    _check_commit(plan, names)
    removed: list[str] = []
    if plan.package_folder and plan.overwrite:  # the earlier package: what the new one does not write again
        inputs = {p.name for p in plan.inputs if p.parent == plan.folder.resolve()}
        removed = sorted(plan.recorded - set(names) - inputs)
    _record(plan, staging, names, removed)
    removed = [n for n in removed if n not in names]  # a manifest written anew is not stale
    stage.replaced = sorted(n for n in names if (plan.folder / n).exists())
    _move_in(plan, staging, names)
    try:
        for name in removed:
            (plan.folder / name).unlink(missing_ok=True)
    except OSError as exc:
        raise OutputWriteError(f"cannot remove {plan.folder / name}: {exc.strerror or exc}") from exc
    stage.removed = removed


@contextlib.contextmanager
def staged_output(plan: OutputPlan) -> Iterator[Staging]:
    """A hidden staging folder inside the output folder; its files are moved into place only when the block
    succeeds, checked once more against the plan, the main file last, and recorded in the manifest."""
    top = _make_folder(plan.folder)
    try:
        staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, suffix=".tmp", dir=plan.folder))
    except OSError as exc:
        raise OutputWriteError(f"cannot write to {plan.folder}: {exc.strerror or exc}") from exc
    stage, done = Staging(staging), False
    try:
        yield stage
        _commit(plan, stage)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not done and top is not None:
            _remove_created(plan.folder, top)


def write_output_text(
    output: str | os.PathLike[str],
    text: str,
    default_name: str,
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    overwrite: bool = False,
) -> Path:
    """Write one text file (a report) by the one rule, atomically; returns its path."""
    plan = plan_output(output, default_name, inputs=inputs, overwrite=overwrite)
    return write_text(plan.path, text)
