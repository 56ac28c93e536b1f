"""modelexport: PyTorch / Hugging Face -> hierarchy-tagged, self-describing ONNX, and what comes after.

The public API is imported lazily so that ``import modelexport`` (and the CLI's ``--help``) stay fast:
torch, transformers and onnxruntime load only when a function that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import Any

# ``modelexport.export`` is the export subpackage, callable as the export function (see its docstring): it
# loads the exporter on first call, so importing it here costs nothing.
from . import export
from ._version import __version__

#: Public name -> "module:attribute" (resolved on first access).
_LAZY: dict[str, str] = {
    "ExportConfig": "modelexport.export.config:ExportConfig",
    "ExportResult": "modelexport.export.api:ExportResult",
    "InputSpec": "modelexport.export.config:InputSpec",
    "create_session": "modelexport.runtime.session:create_session",
    "SessionConfig": "modelexport.runtime.session:SessionConfig",
    "pipeline": "modelexport.inference.pipelines.factory:pipeline",
    "create_pipeline": "modelexport.inference.pipelines.factory:create_pipeline",
    "ONNXAutoProcessor": "modelexport.inference.processors.auto:ONNXAutoProcessor",
    "read_metadata": "modelexport.metadata.store:read_metadata",
    "write_metadata": "modelexport.metadata.store:write_metadata",
    "update_metadata": "modelexport.metadata.store:update_metadata",
    "validate_optimum_compatibility": "modelexport.inspect.optimum:validate_optimum_compatibility",
    "errors": "modelexport.errors",
    "plan_output": "modelexport.onnxfile.output:plan_output",
    "write_output_text": "modelexport.onnxfile.output:write_output_text",
    "quantize": "modelexport.optimize.quantization:quantize",
    "QuantizeConfig": "modelexport.optimize.config:QuantizeConfig",
    "optimize_model": "modelexport.optimize.graph:optimize_model",
    "OptimizeConfig": "modelexport.optimize.config:OptimizeConfig",
    "extract_module_subgraph": "modelexport.inspect.extract:extract_module_subgraph",
    "ModuleSubgraph": "modelexport.inspect.extract:ModuleSubgraph",
    "analyze": "modelexport.inspect.analyze:analyze",
    "validate": "modelexport.inspect.validate:validate",
    "compare": "modelexport.inspect.compare:compare",
    "profile": "modelexport.inspect.profile:profile",
    "TestTimeEngine": "modelexport.testtime.engine:TestTimeEngine",
    "TestTimePolicy": "modelexport.testtime.policy:TestTimePolicy",
    "evaluate": "modelexport.inference.evaluate:evaluate",
    "run_pipeline": "modelexport.workflow:run_pipeline",
    "PipelineConfig": "modelexport.workflow:PipelineConfig",
    "load_dataset": "modelexport.data.readers:load_dataset",
    "batch_infer": "modelexport.batch.api:batch_infer",
    "BatchResult": "modelexport.batch.api:BatchResult",
    "evaluate_batch": "modelexport.batch.evaluate:evaluate_batch",
}

__all__ = ["__version__", "export", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'modelexport' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
