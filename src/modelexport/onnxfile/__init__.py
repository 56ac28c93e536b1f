"""ONNX files on disk, one implementation each: which file a path means, loading with typed errors, the sidecar.

The lowest layer of modelexport beside ``errors`` and ``_io``: every area (metadata, runtime, inference,
inspect, optimize, test-time, pipeline, CLI) resolves, loads and reads through these functions.
"""

from __future__ import annotations

from .load import check_external_locations, load_onnx, load_structure
from .resolve import (
    COMPONENTS_KEY,
    DEFAULT_MODEL_FILE,
    DEPLOYED_KEY,
    PACKAGE_MANIFEST,
    VARIANTS_KEY,
    component_names,
    package_components,
    read_manifest,
    record_deployed_model,
    resolve_model_path,
    variant_file,
    write_derived_manifest,
)
from .save import (
    EXTERNAL_DATA_THRESHOLD,
    external_tensors,
    load_external_tensors,
    model_bytes,
    needs_external_data,
    save_onnx,
)
from .sidecar import SIDECAR_SUFFIX, load_sidecar, read_sidecar, sidecar_path_for

__all__ = [
    "COMPONENTS_KEY",
    "DEFAULT_MODEL_FILE",
    "DEPLOYED_KEY",
    "EXTERNAL_DATA_THRESHOLD",
    "PACKAGE_MANIFEST",
    "SIDECAR_SUFFIX",
    "VARIANTS_KEY",
    "check_external_locations",
    "component_names",
    "external_tensors",
    "load_external_tensors",
    "load_onnx",
    "load_sidecar",
    "load_structure",
    "model_bytes",
    "needs_external_data",
    "package_components",
    "read_manifest",
    "read_sidecar",
    "record_deployed_model",
    "resolve_model_path",
    "save_onnx",
    "sidecar_path_for",
    "variant_file",
    "write_derived_manifest",
]
