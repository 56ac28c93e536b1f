"""MUST: every model we export keeps the plain export's topology, gets 100% tags, and matches PyTorch."""

from __future__ import annotations

import json
from typing import Any

import onnx
import pytest

import modelexport
from modelexport.hierarchy.tags import TAG_KEY, TAG_PATTERN, TAG_SOURCE_KEY
from tests.models.hf_models import HF_TINY, tiny_hf_model
from tests.models.torch_models import TORCH_MODELS

#: transformers' decoder-only models build their masks with torch.vmap, which TorchScript tracing
#: cannot follow; the dynamo exporter (our default) handles them. Asserted in test_errors.py.
TORCHSCRIPT_UNSUPPORTED = {"gpt2", "llama"}

GRID = [(name, ex) for name in HF_TINY for ex in ("dynamo", "torchscript") if not (ex == "torchscript" and name in TORCHSCRIPT_UNSUPPORTED)]


def assert_export_invariants(result: Any) -> None:
    """Topology identical to plain export, 100% coverage, valid tags, parity within atol, sidecar consistent."""
    assert result.topology_identical is True
    assert result.coverage["coverage_pct"] == 100.0
    assert result.parity is not None and result.parity["passed"], result.parity
    model = onnx.load(str(result.onnx_path))
    props = [{p.key: p.value for p in n.metadata_props} for n in model.graph.node]
    assert all(TAG_PATTERN.match(p.get(TAG_KEY, "")) for p in props), "every node needs a well-formed tag"
    assert all(p.get(TAG_SOURCE_KEY) in ("scope", "propagated") for p in props)
    sidecar = json.loads(result.hierarchy_path.read_text())
    assert len(sidecar["nodes"]) == len(model.graph.node)
    assert sidecar["coverage"]["tagged_nodes"] == len(model.graph.node)
    # every tag in the graph is a known module tag or an ancestor of one
    known = set(sidecar["tags"])
    assert {p[TAG_KEY] for p in props} <= known


@pytest.mark.must
@pytest.mark.integration
@pytest.mark.parametrize(("name", "exporter"), GRID, ids=[f"{n}-{e}" for n, e in GRID])
def test_tiny_hf_models(export_cache: Any, name: str, exporter: str) -> None:
    result = export_cache.get(f"hf-{name}", lambda: tiny_hf_model(name), exporter=exporter, verify_topology=True)
    assert_export_invariants(result)
    # most nodes must come from the exporter's own scopes, not from propagation
    assert result.coverage["by_source"].get("scope", 0) >= 0.5 * result.coverage["total_nodes"]


@pytest.mark.must
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", sorted(TORCH_MODELS))
def test_plain_torch_models(export_cache: Any, name: str, exporter: str) -> None:
    result = export_cache.get(f"torch-{name}", TORCH_MODELS[name], exporter=exporter, verify_topology=True)
    assert_export_invariants(result)


@pytest.mark.must
@pytest.mark.integration
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_real_minilm(export_cache: Any, minilm_dir: Any, exporter: str) -> None:
    result = export_cache.get("minilm", str(minilm_dir), exporter=exporter, verify_topology=True)
    assert_export_invariants(result)
    sidecar = json.loads(result.hierarchy_path.read_text())
    layers = {t for t in sidecar["tags"] if t.rsplit("/", 1)[-1].startswith("BertLayer.")}
    assert layers == {f"/BertModel/BertEncoder/BertLayer.{i}" for i in range(6)}
