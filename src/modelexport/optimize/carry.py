"""Carry what a transform drops: model-level metadata and the ``*_hierarchy.json`` sidecar.

ONNX Runtime's quantizers and optimizer write a new ModelProto without the input's
``metadata_props``; users then lose the task, labels and processor settings. These passes copy
them over, record the transform (``modelexport.quantization`` / ``modelexport.optimization``) and
write a sidecar beside the output whose node map describes the new graph. Where a transform writes follows
the one output rule (:func:`transform_plan`, :mod:`modelexport.onnxfile.output`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import write_json
from .._version import __version__
from ..hierarchy.passes import PassResult
from ..hierarchy.tagger import tensor_tags
from ..hierarchy.tags import TAG_KEY, TAG_SOURCE_KEY, node_key, set_props
from ..metadata import read_metadata, update_metadata
from ..metadata.genai import GENAI_CONFIG_FILE, retarget_genai_config
from ..metadata.schema import KEY_GENERATION
from ..onnxfile import (
    DEFAULT_MODEL_FILE,
    GRAPH_FILE_SUFFIXES,
    PACKAGE_FILES,
    PACKAGE_MANIFEST,
    OutputPlan,
    output_path,
    plan_output,
    read_manifest,
    read_sidecar,
    safe_join,
    save_onnx,
    sidecar_path_for,
    write_derived_manifest,
)
from .group_query import shares_cache_buffer

if TYPE_CHECKING:
    import onnx

__all__ = [
    "CarryMetadata",
    "carry_metadata",
    "model_metadata",
    "remap_sidecar",
    "write_sidecar",
    "package_file_names",
    "transform_plan",
    "copy_package_files",
    "write_transformed",
]

log = logging.getLogger(__name__)


def carry_metadata(
    before: onnx.ModelProto, after: onnx.ModelProto, record_key: str, record: dict[str, Any]
) -> list[str]:
    """Copy ``before``'s model-level metadata onto ``after`` and add ``record_key`` (a JSON object).

    Uses ``modelexport.metadata.update_metadata``, which verifies ``before``'s checksum first (metadata that
    fails it is refused, never re-signed) and signs the result. Returns the keys now on ``after``.
    """
    carried = {p.key: p.value for p in before.metadata_props}
    for attr in ("producer_name", "producer_version", "doc_string", "model_version"):
        if not getattr(after, attr, None) and getattr(before, attr, None):
            setattr(after, attr, getattr(before, attr))
    after.ClearField("metadata_props")
    set_props(after, carried)
    record = json.loads(json.dumps(record, default=str))  # plain JSON types only
    update_metadata(after, {record_key: record, **_cache_layout(after)})
    return sorted({p.key for p in after.metadata_props})


def _cache_layout(model: onnx.ModelProto) -> dict[str, Any]:
    """The generation record with ``cache.shared_buffer`` as ``model``'s graph allows it (a transform may have
    given the cache to ``GroupQueryAttention``, or taken it away): {} when nothing changes."""
    generation = read_metadata(model).get(KEY_GENERATION)
    cache = generation.get("cache") if isinstance(generation, dict) else None
    if not isinstance(cache, dict):
        return {}
    shared = shares_cache_buffer(model)
    if bool(cache.get("shared_buffer")) == shared:
        return {}
    cache = {k: v for k, v in cache.items() if k != "shared_buffer"}
    return {KEY_GENERATION: {**generation, "cache": {**cache, "shared_buffer": True} if shared else cache}}


@dataclass(frozen=True)
class CarryMetadata:
    """:func:`carry_metadata` as a pass: ``source``'s model metadata and ``record`` onto its input (in place)."""

    source: onnx.ModelProto
    record_key: str
    record: dict[str, Any]
    name = "carry_metadata"
    in_place = True

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        keys = carry_metadata(self.source, model, self.record_key, self.record)
        return PassResult(model, True, {"metadata_keys": keys})


def model_metadata(model: onnx.ModelProto) -> dict[str, Any]:
    """Decoded model-level metadata (``modelexport.metadata.read_metadata``), {} when unreadable."""
    try:
        return read_metadata(model)
    except Exception:  # noqa: BLE001 - read for hints (config sizes, processor); carrying verifies (source.py)
        return {p.key: p.value for p in model.metadata_props}


def remap_sidecar(
    sidecar: dict[str, Any], model: onnx.ModelProto, transform: dict[str, Any]
) -> dict[str, Any]:
    """A copy of ``sidecar`` whose nodes, tensors and coverage describe ``model`` (already re-tagged)."""
    tag_to_path = sidecar.get("tags", {})
    nodes: dict[str, Any] = {}
    for i, node in enumerate(model.graph.node):
        props = {p.key: p.value for p in node.metadata_props}
        tag = props.get(TAG_KEY)
        nodes[node_key(node, i)] = {
            "tag": tag,
            "source": props.get(TAG_SOURCE_KEY),
            "op_type": node.op_type,
            "module": tag_to_path.get(tag) if tag else None,
        }
    sources: dict[str, int] = {}
    for entry in nodes.values():
        sources[entry["source"] or "none"] = sources.get(entry["source"] or "none", 0) + 1
    tagged = sum(1 for e in nodes.values() if e["tag"])
    out = dict(sidecar)
    out["generator"] = f"modelexport {__version__}"
    out["nodes"] = nodes
    out["tensors"] = tensor_tags(model)
    out["coverage"] = {
        "total_nodes": len(nodes),
        "tagged_nodes": tagged,
        "coverage_pct": round(100.0 * tagged / len(nodes), 3) if nodes else 100.0,
        "by_source": sources,
        "unique_tags": len({e["tag"] for e in nodes.values() if e["tag"]}),
    }
    out["transforms"] = [*sidecar.get("transforms", []), transform]
    return out


def write_sidecar(
    sidecar: dict[str, Any] | None, model: onnx.ModelProto, onnx_path: str | Path, transform: dict[str, Any]
) -> Path | None:
    """Write the re-mapped sidecar beside ``onnx_path``; nothing when the input had none."""
    if sidecar is None:
        return None
    return write_json(sidecar_path_for(onnx_path), remap_sidecar(sidecar, model, transform))


def _same_file(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def package_file_names(src_dir: Path, dst_dir: Path, *, whole: bool = True) -> list[str]:
    """The source package's config and processor files a transformed model written into ``dst_dir`` needs
    beside it: none in the source's own folder; else those of the source manifest's file list (what export
    wrote), else of :data:`~modelexport.onnxfile.PACKAGE_FILES`, that are present. Graph files and their
    sidecars are not package files (a multi-graph manifest lists them): each transform writes its own.
    Unless ``whole`` (a new package), a file already in ``dst_dir`` with the same bytes is not written again
    (a second transform of the same package into one folder)."""
    if src_dir.resolve() == dst_dir.resolve():
        return []
    listed = read_manifest(src_dir).get("files")
    names = [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else list(PACKAGE_FILES)
    names = [n for n in names if not n.endswith(GRAPH_FILE_SUFFIXES) and safe_join(src_dir, n).is_file()]
    if whole:
        return names
    return [n for n in names if not _same_file(safe_join(src_dir, n), safe_join(dst_dir, n))]


def transform_plan(
    src: Path,
    output: str | os.PathLike[str],
    *,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    overwrite: bool = False,
) -> OutputPlan:
    """The output plan of a one-graph transform of ``src`` (the one rule, :func:`plan_output`): the model,
    and beside it in another folder the source's package files and a manifest (in a folder that has none)."""
    target, is_folder = output_path(output, DEFAULT_MODEL_FILE, bare_is_folder=True)
    package = package_file_names(src.parent, target.parent, whole=is_folder)
    if package and (is_folder or not (target.parent / PACKAGE_MANIFEST).exists()):
        package.append(PACKAGE_MANIFEST)
    return plan_output(
        output,
        DEFAULT_MODEL_FILE,
        inputs=(src, *inputs),
        package=package,
        bare_is_folder=True,
        package_folder=True,
        overwrite=overwrite,
    )


def copy_package_files(src_dir: Path, dst_dir: Path, names: Iterable[str]) -> list[str]:
    """Copy the package files ``names`` (from :func:`package_file_names`) into ``dst_dir`` (a staging folder);
    the manifest is derived, not copied."""
    copied = []
    for name in names:
        if name == PACKAGE_MANIFEST:
            continue
        target = safe_join(dst_dir, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(safe_join(src_dir, name), target)
        copied.append(name)
    return copied


def _retarget_genai(model: onnx.ModelProto, dst: Path, copied: list[str]) -> list[str]:
    """The copied genai_config.json pointed at the transformed graph ``dst``; dropped when it no longer
    fits."""
    staged = dst.parent / GENAI_CONFIG_FILE
    mismatch = retarget_genai_config(staged, model, dst.name, shares_cache_buffer(model))
    if mismatch is None:
        return copied
    staged.unlink()  # our own copy in the staging folder
    log.warning("%s not carried: %s", GENAI_CONFIG_FILE, mismatch)
    return [n for n in copied if n != GENAI_CONFIG_FILE]


def write_transformed(
    model: onnx.ModelProto,
    src: Path,
    dst: Path,
    transform: dict[str, Any],
    package: Iterable[str] = (),
    *,
    external_data: bool = False,
) -> tuple[Path | None, list[str]]:
    """Write a transformed model into ``dst`` (in a staging folder): its re-mapped sidecar, the ``package``
    files copied from the source's folder (with a manifest derived from the source's when ``package`` names
    one), then the model (``external_data``: its weights in ``<name>.data`` beside it, whatever their size).
    A copied ``genai_config.json`` names ``dst`` as its decoder (dropped, and logged, if ``model`` no longer
    has the inputs and outputs it names).

    The source sidecar is read before anything is written (a broken one fails with nothing on disk).
    """
    sidecar = read_sidecar(src)
    package = list(package)
    copied = copy_package_files(src.parent, dst.parent, package)
    if GENAI_CONFIG_FILE in copied:
        copied = _retarget_genai(model, dst, copied)
    if PACKAGE_MANIFEST in package:
        write_derived_manifest(src.parent, dst.parent, None, copied)
    side = write_sidecar(sidecar, model, dst, transform)
    save_onnx(model, dst, external_data=external_data or None)
    return side, copied
