"""The Optimum-compatible output folder: config.json, the source's processor files, export_metadata.json.

File names that come from configs (a tokenizer's vocab files) are checked before copying: only
plain names inside the source folder, never absolute paths or ``..``, and never a symbolic link that leads out
of the folder (its target's content would end up in a package users share). The one exception is the Hugging
Face cache's own layout, where a snapshot's files link to the same repository's ``blobs/``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from .._io import write_json
from ..errors import MetadataError
from ..onnxfile import (
    COMPONENTS_KEY,
    DEPLOYED_KEY,
    PACKAGE_MANIFEST,
    PROCESSOR_FILES,
    VARIANTS_KEY,
    safe_join,
)
from .build import complete_processor_config

__all__ = ["safe_join", "write_package_files", "processor_file_names"]
_PREPROCESSOR_FILE = "preprocessor_config.json"


def processor_file_names(tokenizer: Any) -> list[str]:
    """Processor files a model folder may hold: transformers' fixed names plus the tokenizer's vocab files."""
    names = list(PROCESSOR_FILES)
    for value in (getattr(tokenizer, "vocab_files_names", None) or {}).values():
        if value not in names:
            names.append(value)
    return names


def _write_user_preprocessor(ctx: Any) -> list[str]:
    """The user's processor config (plain torch models) as a transformers ``preprocessor_config.json``."""
    if not ctx.config.processor_config:
        return []
    write_json(ctx.staging_dir / _PREPROCESSOR_FILE, complete_processor_config(ctx.config.processor_config))
    return [_PREPROCESSOR_FILE]


def _copy_processor_files(ctx: Any) -> list[str]:
    src = ctx.loaded.model_dir
    copied = _write_user_preprocessor(ctx)
    if src is None:
        if ctx.tokenizer is not None:
            copied += [Path(f).name for f in ctx.tokenizer.save_pretrained(str(ctx.staging_dir))]
        return copied
    for name in processor_file_names(ctx.tokenizer):
        if name in copied:
            continue
        source = safe_join(Path(src), name)
        if source.is_file():
            target = safe_join(ctx.staging_dir, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(name)
    return copied


def write_package_files(ctx: Any) -> list[str]:
    """Write the package files into ``ctx.staging_dir`` and record them in ``ctx.files``."""
    written: list[str] = []
    config = ctx.loaded.hf_config
    if config is not None:
        config.to_json_file(str(ctx.staging_dir / "config.json"), use_diff=True)
        written.append("config.json")
        ctx.files["config"] = "config.json"
    elif ctx.loaded.source == "huggingface":
        raise MetadataError(
            f"{ctx.loaded.name_or_path}: transformers model without a config; cannot write config.json"
        )
    else:
        ctx.notes.append(
            "plain torch model: no config.json written, so Optimum cannot load this folder; "
            "modelexport.pipeline can (task, labels and pre-processing come from the embedded metadata)"
        )
    for name in _copy_processor_files(ctx):
        written.append(name)
        ctx.files[f"processor:{name}"] = name
    if "metadata" in ctx.extra:
        doc = {
            "metadata": ctx.extra["metadata"],
            "stats": ctx.extra.get("metadata_stats"),
            "files": sorted({*written, *ctx.extra.get("package_files", ())}),  # + files earlier passes wrote
        }
        for key in (COMPONENTS_KEY, VARIANTS_KEY, DEPLOYED_KEY):  # a multi-graph package: its graph sets
            if ctx.extra.get(key):
                doc[key] = ctx.extra[key]
        write_json(ctx.staging_dir / PACKAGE_MANIFEST, doc)
        written.append(PACKAGE_MANIFEST)
        ctx.files["export_metadata"] = PACKAGE_MANIFEST
    return written
