"""modelexport: PyTorch / Hugging Face -> hierarchy-tagged, self-describing ONNX, and what comes after.

The public API is imported lazily so that ``import modelexport`` (and the CLI's ``--help``) stay fast:
torch, transformers and onnxruntime load only when a function that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# The subpackage ``modelexport.export`` and the function ``modelexport.export`` share a name: import the
# (torch-free) subpackage first so that binding happens now, then bind the name to the function.
from . import export as _export_package  # noqa: F401
from .export.api import export

#: Public name -> "module:attribute" (resolved on first access).
_LAZY: dict[str, str] = {
    "ExportConfig": "modelexport.export.config:ExportConfig",
    "ExportResult": "modelexport.export.api:ExportResult",
    "InputSpec": "modelexport.export.config:InputSpec",
    "create_session": "modelexport.runtime.session:create_session",
    "SessionConfig": "modelexport.runtime.session:SessionConfig",
    "errors": "modelexport.errors",
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


if TYPE_CHECKING:  # pragma: no cover
    from . import errors
    from .export.api import ExportResult
    from .export.config import ExportConfig, InputSpec
    from .runtime.session import SessionConfig, create_session
