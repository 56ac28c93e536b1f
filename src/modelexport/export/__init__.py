"""Export: capture with torch.onnx (dynamo / torchscript), example inputs, verification, output package."""

from .api import ExportResult, export
from .config import ExportConfig, InputSpec, load_input_specs

__all__ = ["ExportConfig", "ExportResult", "InputSpec", "export", "load_input_specs"]
