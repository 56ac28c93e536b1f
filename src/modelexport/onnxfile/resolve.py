"""Which ``.onnx`` file a path means: the one rule every command uses.

A file is itself. A folder (an export package, a pipeline output) means, in order: the deployed model
its manifest records (``export_metadata.json`` -> ``deployed_model``, written by the pipeline when it
deploys ``model_dynamic.onnx`` and by ``export --optimize``), else the first graph of a multi-graph package
(``components``: an encoder-decoder's encoder, which runs first; its pipeline opens the others), else
``model.onnx``, else its only ``.onnx`` file. Anything else is an error that lists the candidates. The
choice is logged at INFO so a user always sees which file ran.

A multi-graph package may hold transformed copies of its graphs (``export --optimize O2 --quantize
dynamic``: ``encoder_model_O2.onnx``, ``decoder_model_O2.onnx``, ...): the manifest lists each set under
``variants`` ({suffix: {role: file}}), and :func:`package_components` gives the set a graph belongs to.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from .._io import read_json_object, write_json
from ..errors import ModelFileNotFoundError, OnnxFileError

__all__ = [
    "DEFAULT_MODEL_FILE",
    "PACKAGE_MANIFEST",
    "DEPLOYED_KEY",
    "COMPONENTS_KEY",
    "VARIANTS_KEY",
    "WRITTEN_KEY",
    "component_names",
    "package_components",
    "variant_file",
    "write_derived_manifest",
    "resolve_model_path",
    "folder_model",
    "read_manifest",
    "record_deployed_model",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILE = "model.onnx"
#: The package manifest export writes (metadata, stats, file list); the pipeline adds the deployed model.
PACKAGE_MANIFEST = "export_metadata.json"
DEPLOYED_KEY = "deployed_model"
#: The manifest's graphs of a multi-graph package: {role: file name}, in the order they run.
COMPONENTS_KEY = "components"
#: The manifest's transformed copies of those graphs: {suffix ("O2", "dynamic"): {role: file name}}.
VARIANTS_KEY = "variants"
#: The manifest's list of the files in its folder that runs of ours wrote (what ``--overwrite`` may replace).
WRITTEN_KEY = "written"


def variant_file(model_file: str, suffix: str) -> str:
    """The name of a transformed copy of ``model_file``: ``encoder_model.onnx`` + ``O2`` -> ``encoder_model_O2.onnx``."""
    return f"{PurePosixPath(model_file).stem}_{suffix}.onnx"


def read_manifest(folder: Path) -> dict:
    """The folder's manifest, ``{}`` when there is none; a broken one is an error, never ignored."""
    file = folder / PACKAGE_MANIFEST
    if not file.is_file():
        return {}
    return read_json_object(file, OnnxFileError, "re-export the package, or pass the .onnx file itself")


def _listed_file(folder: Path, name: object, key: str, what: str) -> Path:
    """A file the manifest names under ``key`` (as ``what``): a plain name inside ``folder`` that exists."""
    parts = PurePosixPath(str(name)).parts
    if not isinstance(name, str) or len(parts) != 1 or parts[0] in ("..", "."):
        raise OnnxFileError(f"{folder / PACKAGE_MANIFEST}: {key} must be a file name in the folder")
    file = folder / name
    if not file.is_file():
        raise ModelFileNotFoundError(
            f"{folder / PACKAGE_MANIFEST} names {name} as {what}, but it is missing",
            hint="restore the file, or pass the .onnx file to use",
        )
    return file


def _deployed(folder: Path) -> Path | None:
    name = read_manifest(folder).get(DEPLOYED_KEY)
    return None if name is None else _listed_file(folder, name, DEPLOYED_KEY, "the deployed model")


def _role_map(folder: Path, value: object, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise OnnxFileError(f"{folder / PACKAGE_MANIFEST}: {key} must map roles to file names")
    return {str(role): name for role, name in value.items()}


def _component_sets(folder: Path) -> list[dict[str, str]]:
    """The graph sets of a multi-graph package: the exported graphs, then each variant ([] for one graph)."""
    manifest = read_manifest(folder) if folder.is_dir() else {}
    if not manifest.get(COMPONENTS_KEY):
        return []
    sets = [_role_map(folder, manifest[COMPONENTS_KEY], COMPONENTS_KEY)]
    variants = manifest.get(VARIANTS_KEY) or {}
    if not isinstance(variants, dict):
        raise OnnxFileError(f"{folder / PACKAGE_MANIFEST}: {VARIANTS_KEY} must map suffixes to graph sets")
    for suffix, graphs in variants.items():
        graphs = _role_map(folder, graphs, f"{VARIANTS_KEY}.{suffix}")
        if list(graphs) != list(sets[0]):
            raise OnnxFileError(
                f"{folder / PACKAGE_MANIFEST}: {VARIANTS_KEY}.{suffix} has roles {list(graphs)}, "
                f"the package's graphs are {list(sets[0])}"
            )
        sets.append(graphs)
    return sets


def component_names(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The exported graphs' file names by role (``{}`` for a one-graph package), in the order they run."""
    sets = _component_sets(Path(folder))
    return sets[0] if sets else {}


def package_components(
    folder: str | os.PathLike[str], entry: str | os.PathLike[str] | None = None
) -> dict[str, Path]:
    """The graphs of a multi-graph package by role (``{}`` for a one-graph package), in the order they run.

    The set whose first graph is ``entry`` (the file a pipeline opened), else the set of the deployed model,
    else the exported graphs: an optimized or quantized encoder runs with the decoders of its own set.
    """
    folder = Path(folder)
    sets = _component_sets(folder)
    if not sets:
        return {}
    wanted = Path(entry).name if entry is not None else read_manifest(folder).get(DEPLOYED_KEY)
    chosen = next((s for s in sets if next(iter(s.values()), None) == wanted), sets[0])
    return {
        role: _listed_file(folder, name, COMPONENTS_KEY, f"the package's {role} graph")
        for role, name in chosen.items()
    }


def _in_folder(folder: Path) -> tuple[Path, str]:
    deployed = _deployed(folder)
    if deployed is not None:
        return deployed, f"deployed model recorded in {PACKAGE_MANIFEST}"
    components = package_components(folder)
    if components:
        role, file = next(iter(components.items()))
        return file, f"the {role} of the package's {len(components)} graphs"
    if (folder / DEFAULT_MODEL_FILE).is_file():
        return folder / DEFAULT_MODEL_FILE, "the package's default model file"
    candidates = sorted(p for p in folder.glob("*.onnx") if p.is_file())
    if len(candidates) == 1:
        return candidates[0], "the only .onnx file in the folder"
    if not candidates:
        raise ModelFileNotFoundError(
            f"no .onnx file in {folder}", hint="pass an export folder or a .onnx file"
        )
    names = ", ".join(p.name for p in candidates)
    raise OnnxFileError(
        f"{folder} holds {len(candidates)} .onnx files ({names}), no {DEFAULT_MODEL_FILE} and no deployed model",
        hint="pass the .onnx file to use",
    )


def folder_model(folder: str | os.PathLike[str]) -> Path | None:
    """The ``.onnx`` file a package folder means (as :func:`resolve_model_path`, not logged); None when the
    folder means none or several."""
    try:
        return _in_folder(Path(folder))[0]
    except OnnxFileError:
        return None


def resolve_model_path(model: str | os.PathLike[str]) -> Path:
    """The ``.onnx`` file ``model`` means (a file, or a package folder: see the module docstring)."""
    path = Path(model)
    if path.is_dir():
        file, why = _in_folder(path)
        log.info("model file: %s (%s)", file, why)
        return file
    if not path.exists():
        raise ModelFileNotFoundError(
            f"ONNX model not found: {path}", hint="check the path (an export folder holds model.onnx)"
        )
    if not path.is_file():
        raise OnnxFileError(f"{path} is not a regular file")
    log.info("model file: %s", path)
    return path


def record_deployed_model(folder: Path, model_file: str) -> None:
    """Record ``model_file`` (a name inside ``folder``) as the package's deployed model."""
    manifest = read_manifest(folder)
    manifest[DEPLOYED_KEY] = model_file
    write_json(folder / PACKAGE_MANIFEST, manifest)


def write_derived_manifest(
    src_dir: Path, dst_dir: Path, components: dict[str, str] | None, copied: Iterable[str] = ()
) -> Path:
    """The manifest of a package made from ``src_dir``'s (its graphs transformed into ``dst_dir``): the
    source's metadata, ``components`` as its graphs (a multi-graph package), no variants or deployed model,
    and as its files those listed or ``copied`` that are now present."""
    drop = (DEPLOYED_KEY, VARIANTS_KEY, COMPONENTS_KEY, WRITTEN_KEY)
    manifest = {k: v for k, v in read_manifest(src_dir).items() if k not in drop}
    if components:
        manifest[COMPONENTS_KEY] = components
    listed = manifest.get("files") if isinstance(manifest.get("files"), list) else []
    names = {str(n) for n in listed} | set(copied)
    manifest["files"] = sorted(names & {p.name for p in dst_dir.iterdir()})
    return write_json(dst_dir / PACKAGE_MANIFEST, manifest)
