"""``model_hierarchy.json``: module info (R9), node -> tag map, tensor tags (R13), settings, coverage.

Built from the tagging alone (hierarchy layer), so the export and the package steps above it
(``export --quantize``) write it the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._version import __version__
from .tagger import TaggingResult, tensor_tags
from .tags import TAG_KEY, TAG_SOURCE_KEY
from .tree import ModuleTree

if TYPE_CHECKING:
    import onnx

__all__ = ["SIDECAR_NAME", "SIDECAR_VERSION", "build_sidecar"]

SIDECAR_NAME = "model_hierarchy.json"
SIDECAR_VERSION = "1.0"


def build_sidecar(
    model: onnx.ModelProto,
    tree: ModuleTree,
    tagging: TaggingResult,
    settings: dict[str, Any],
    model_info: dict[str, Any],
) -> dict[str, Any]:
    """The sidecar document; every value derives from the tagged model and the module tree."""
    return {
        "format": "modelexport.hierarchy",
        "version": SIDECAR_VERSION,
        "generator": f"modelexport {__version__}",
        "tag_key": TAG_KEY,
        "tag_source_key": TAG_SOURCE_KEY,
        "model": model_info,
        "export": settings,
        "coverage": tagging.coverage,
        "modules": {path or "": info.to_dict() for path, info in tree.info.items()},
        "tags": {tag: path for tag, path in sorted(tree.tag_to_path.items())},
        "nodes": {
            key: {
                "tag": tagging.node_tags[key],
                "source": tagging.sources[key],
                "op_type": tagging.op_types[key],
                "module": tagging.module_paths.get(key),
            }
            for key in tagging.op_types
        },
        "tensors": tensor_tags(model),
    }
