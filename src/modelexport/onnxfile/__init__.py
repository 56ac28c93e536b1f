"""ONNX files on disk, one implementation each: which file a path means, loading with typed errors, the sidecar,
and where a command writes (the one output rule, :mod:`.output`).

The lowest layer of modelexport beside ``errors`` and ``_io``: every area (metadata, runtime, inference,
inspect, optimize, test-time, pipeline, CLI) resolves, loads and reads through these functions.
"""

from __future__ import annotations

from .inside import safe_join
from .load import check_external_locations, load_onnx, load_structure
from .output import (
    GRAPH_FILE_SUFFIXES,
    MODEL_SUFFIX,
    PACKAGE_FILES,
    PROCESSOR_FILES,
    OutputPlan,
    Staging,
    is_package_file,
    output_path,
    own_files,
    plan_output,
    recorded_files,
    staged_output,
    write_output_text,
)
from .resolve import (
    COMPONENTS_KEY,
    DEFAULT_MODEL_FILE,
    DEPLOYED_KEY,
    PACKAGE_MANIFEST,
    VARIANTS_KEY,
    WRITTEN_KEY,
    component_names,
    folder_model,
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
    "GRAPH_FILE_SUFFIXES",
    "MODEL_SUFFIX",
    "PACKAGE_FILES",
    "PROCESSOR_FILES",
    "WRITTEN_KEY",
    "OutputPlan",
    "Staging",
    "is_package_file",
    "output_path",
    "own_files",
    "plan_output",
    "recorded_files",
    "staged_output",
    "write_output_text",
    "DEFAULT_MODEL_FILE",
    "DEPLOYED_KEY",
    "EXTERNAL_DATA_THRESHOLD",
    "PACKAGE_MANIFEST",
    "SIDECAR_SUFFIX",
    "VARIANTS_KEY",
    "check_external_locations",
    "component_names",
    "external_tensors",
    "folder_model",
    "load_external_tensors",
    "load_onnx",
    "load_sidecar",
    "load_structure",
    "safe_join",
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
