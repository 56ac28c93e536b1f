"""Train a classifier with DSPy, deploy it as ONNX, and choose its test-time policy.

The end-to-end pipeline that composes these lives in :mod:`modelexport.workflow`.

- :class:`ClassifierProgram`: the classifier as a ``dspy.Module`` (torch for training, ONNX Runtime deployed).
- :class:`TorchWeightOptimizer`: a DSPy teleprompter that trains torch weights (no LM involved).
- :class:`TestTimePolicyOptimizer`: a teleprompter that picks TTA / BN adaptation within a latency budget.
- :class:`ONNXInferenceTool`: the deployed model as a ``dspy.Tool``.

Import the submodules for the names; this package imports dspy and torch only when they are used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ClassifierProgram": "program",
    "to_examples": "program",
    "label_accuracy": "program",
    "NETWORKS": "networks",
    "build_network": "networks",
    "register_network": "networks",
    "TorchWeightOptimizer": "weights",
    "TrainConfig": "weights",
    "TestTimePolicyOptimizer": "policy_search",
    "PolicySearchSpace": "policy_search",
    "ONNXInferenceTool": "tools",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
