"""The Optimum-compatible output folder: config.json, the source's processor files, export_metadata.json.

File names that come from configs (a tokenizer's vocab files) are checked before copying: only
plain names inside the source folder, never absolute paths or ``..``, and never a symbolic link that leads out
of the folder (its target's content would end up in a package users share). The one exception is the Hugging
Face cache's own layout, where a snapshot's files link to the same repository's ``blobs/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import write_json
from ..errors import MetadataError
from ..onnxfile import (
    COMPONENTS_KEY,
    DEPLOYED_KEY,
    PACKAGE_MANIFEST,
    PROCESSOR_FILES,
    VARIANTS_KEY,
    safe_join,
    sidecar_path_for,
)
from .build import ModelSource, complete_processor_config
from .embed import MetadataStats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "GraphSet",
    "Manifest",
    "PackageFiles",
    "safe_join",
    "write_package_files",
    "processor_file_names",
]
_PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class GraphSet:
    """The graphs of a multi-graph package as its manifest lists them: file by role (the first runs first),
    the copies ``--optimize`` / ``--quantize`` write of each (by suffix), and the deployed entry graph."""

    components: dict[str, str]
    variants: dict[str, dict[str, str]] = field(default_factory=dict)
    deployed: str | None = None

    def manifest_entries(self) -> dict[str, Any]:
        entries: dict[str, Any] = {COMPONENTS_KEY: self.components}
        if self.variants:
            entries[VARIANTS_KEY] = self.variants
        if self.deployed:
            entries[DEPLOYED_KEY] = self.deployed
        return entries

    def files(self) -> list[str]:
        """Every graph and copy, each with its sidecar."""
        every = [f for s in (self.components, *self.variants.values()) for f in s.values()]
        return [n for f in every for n in (f, sidecar_path_for(f).name)]


@dataclass(frozen=True)
class Manifest:
    """What ``export_metadata.json`` records besides the files the package step writes."""

    metadata: Mapping[str, Any]
    stats: MetadataStats
    #: Files earlier steps wrote into the package (every graph of a set, generation_config.json,
    #: genai_config.json).
    files: tuple[str, ...] = ()
    graphs: GraphSet | None = None


@dataclass(frozen=True)
class PackageFiles:
    """The files the package step wrote, by role (``config``, ``processor:vocab.txt``, ``export_metadata``),
    and notes for the user."""

    files: dict[str, str]
    notes: tuple[str, ...] = ()


def processor_file_names(tokenizer: PreTrainedTokenizerBase | None) -> list[str]:
    """Processor files a model folder may hold: transformers' fixed names plus the tokenizer's vocab files."""
    names = list(PROCESSOR_FILES)
    for value in (getattr(tokenizer, "vocab_files_names", None) or {}).values():
        if value not in names:
            names.append(value)
    return names


def _write_user_preprocessor(processor_config: dict[str, Any] | None, folder: Path) -> list[str]:
    """The user's processor config (plain torch models) as a transformers ``preprocessor_config.json``."""
    if not processor_config:
        return []
    write_json(folder / _PREPROCESSOR_FILE, complete_processor_config(processor_config))
    return [_PREPROCESSOR_FILE]


def _copy_processor_files(
    model: ModelSource,
    tokenizer: PreTrainedTokenizerBase | None,
    processor_config: dict[str, Any] | None,
    folder: Path,
) -> list[str]:
    src = model.model_dir
    copied = _write_user_preprocessor(processor_config, folder)
    if src is None:
        if tokenizer is not None:
            copied += [Path(f).name for f in tokenizer.save_pretrained(str(folder))]
        return copied
    for name in processor_file_names(tokenizer):
        if name in copied:
            continue
        source = safe_join(Path(src), name)
        if source.is_file():
            target = safe_join(folder, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(name)
    return copied


def write_package_files(
    model: ModelSource,
    tokenizer: PreTrainedTokenizerBase | None,
    processor_config: dict[str, Any] | None,
    folder: Path,
    manifest: Manifest | None,
) -> PackageFiles:
    """Write config.json, the processor files and (given a ``manifest``) export_metadata.json into ``folder``."""
    files: dict[str, str] = {}
    notes: list[str] = []
    config = model.hf_config
    if config is not None:
        config.to_json_file(str(folder / "config.json"), use_diff=True)
        files["config"] = "config.json"
    elif model.source == "huggingface":
        raise MetadataError(
            f"{model.name_or_path}: transformers model without a config; cannot write config.json"
        )
    else:
        notes.append(
            "plain torch model: no config.json written, so Optimum cannot load this folder; "
            "modelexport.pipeline can (task, labels and pre-processing come from the embedded metadata)"
        )
    for name in _copy_processor_files(model, tokenizer, processor_config, folder):
        files[f"processor:{name}"] = name
    if manifest is not None:
        doc = {
            "metadata": manifest.metadata,
            "stats": manifest.stats.to_dict(),
            "files": sorted({*files.values(), *manifest.files}),  # + files earlier steps wrote
        }
        if manifest.graphs is not None:  # a multi-graph package: its graph sets
            doc.update(manifest.graphs.manifest_entries())
        write_json(folder / PACKAGE_MANIFEST, doc)
        files["export_metadata"] = PACKAGE_MANIFEST
    return PackageFiles(files, tuple(notes))
