"""Model Explorer node-data overlays: per-node values (time, error) that colour the graph and sum per layer.

Model Explorer's ONNX adapter names a graph by the ONNX graph name (``<main>`` when it has none) and a node
by its name (``<node_i>`` when it has none); its node-data format is
``{graph id: {"results": {node id: {"value": v}}, "gradient": [...]}}``. Since every tagged node carries
``namespace`` = its tag's levels, the adapter's layers are our modules, and the overlay's per-layer
aggregates are per-module totals.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import write_json
from ..errors import ConfigError
from .loading import ModelLike, load_tagged_model
from .profile import ProfileResult

if TYPE_CHECKING:
    import onnx

#: The overlay's file name in a folder given as ``--node-data DIR/``.
NODE_DATA_NAME = "node_data.json"

__all__ = [
    "NODE_DATA_NAME",
    "GRADIENT",
    "adapter_node_ids",
    "error_overlay",
    "module_values_to_nodes",
    "node_data_overlay",
    "profile_overlay",
    "write_node_data",
]

#: Low values pale yellow, high values red (Model Explorer interpolates between the stops).
GRADIENT = [
    {"stop": 0, "bgColor": "#fff7bc"},
    {"stop": 0.5, "bgColor": "#fe9929"},
    {"stop": 1, "bgColor": "#d7301f"},
]


def adapter_node_ids(model: onnx.ModelProto) -> list[str]:
    """The ids Model Explorer's ONNX adapter gives the main graph's nodes, in graph order."""
    return [node.name or f"<node_{i}>" for i, node in enumerate(model.graph.node)]


def graph_id(model: onnx.ModelProto) -> str:
    return model.graph.name or "<main>"


def node_data_overlay(model: onnx.ModelProto, values: Mapping[int, float], name: str) -> dict[str, Any]:
    """The overlay of ``values`` (node index in ``model.graph.node`` -> number) for the main graph."""
    ids = adapter_node_ids(model)
    bad = [i for i in values if not 0 <= i < len(ids)]
    if bad:
        raise ConfigError(f"node indices {bad[:5]} are not nodes of the model ({len(ids)} nodes)")
    results = {ids[i]: {"value": float(v)} for i, v in sorted(values.items())}
    return {graph_id(model): {"name": name, "results": results, "gradient": GRADIENT}}


def module_values_to_nodes(tags: list[str | None], per_module: Mapping[str, float]) -> dict[int, float]:
    """Each node gets the value of the deepest module in ``per_module`` that contains its tag."""
    out: dict[int, float] = {}
    for i, tag in enumerate(tags):
        if not tag:
            continue
        parts = tag[1:].split("/")
        for depth in range(len(parts), 0, -1):
            module = "/" + "/".join(parts[:depth])
            if module in per_module:
                out[i] = per_module[module]
                break
    return out


def write_node_data(path: str | os.PathLike[str], overlay: dict[str, Any]) -> Path:
    """Write the overlay atomically (what Model Explorer's ``--node_data_paths`` and UI load)."""
    return write_json(path, overlay)


def profile_overlay(model: ModelLike, result: ProfileResult) -> dict[str, Any]:
    """Mean microseconds per run of each timed node of ``model`` (the model that was profiled)."""
    tm = load_tagged_model(model, weights=False)
    position = {k: i for i, k in enumerate(tm.index.keys)}
    values = {position[k]: us for k, us in result.node_us.items() if k in position}
    return node_data_overlay(tm.proto, values, "kernel time (us per run)")


def error_overlay(model: ModelLike, error_report: list[dict[str, Any]]) -> dict[str, Any]:
    """``quantize --error-report``'s max abs error of each module, on every node of that module in ``model``."""
    tm = load_tagged_model(model, weights=False)
    per_module = {r["module"]: r["max_abs_error"] for r in error_report}
    values = module_values_to_nodes(tm.index.tags, per_module)
    return node_data_overlay(tm.proto, values, "quantization error (max abs, module outputs)")
