"""Export: capture with torch.onnx (dynamo / torchscript), example inputs, verification, output package.

This package is also the ``export`` function: ``modelexport.export(model, output_dir, ...)`` calls
:func:`modelexport.export.api.export`. The function and the subpackage share the name ``modelexport.export``,
and Python rebinds that attribute to the subpackage whenever any ``modelexport.export.*`` module is imported;
a callable package keeps one meaning for the name in every import order. Its members load on first use, so
``import modelexport`` does not import the exporter (or torch) until something is exported.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import export
    from .config import ExportConfig, InputSpec, load_input_specs
    from .result import ExportResult

__all__ = ["ExportConfig", "ExportResult", "InputSpec", "export", "load_input_specs"]

#: Public name -> the submodule defining it (imported on first access).
_LAZY: dict[str, str] = {
    "ExportConfig": "config",
    "InputSpec": "config",
    "load_input_specs": "config",
    "ExportResult": "result",
    "export": "api",
}


def __getattr__(name: str) -> Any:
    submodule = _LAZY.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _CallablePackage(types.ModuleType):
    """The ``modelexport.export`` package, callable as the ``export`` function it holds."""

    def __call__(self, *args: object, **kwargs: object) -> ExportResult:
        return __getattr__("export")(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
