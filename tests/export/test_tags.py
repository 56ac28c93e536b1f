"""Tag rules: class names from the root, instance indices, torch.nn filtering, reuse, collisions."""

from __future__ import annotations

import json
from typing import Any

import onnx
import pytest
from onnx import helper

from modelexport.hierarchy import ModuleTree, TagRules
from modelexport.hierarchy.tagger import propagate_tags
from modelexport.hierarchy.tags import TAG_KEY, common_ancestor, parse_tag
from tests.models.hf_models import tiny_hf_model
from tests.models.torch_models import TORCH_MODELS, ReuseTwice, SmallCNN, TwoStages


def node_tags(result: Any) -> list[str]:
    model = onnx.load(str(result.onnx_path))
    return [next(p.value for p in n.metadata_props if p.key == TAG_KEY) for n in model.graph.node]


@pytest.mark.sanity
def test_bert_tags_follow_the_module_tree(tiny_bert_export: Any) -> None:
    tags = set(node_tags(tiny_bert_export))
    assert "/BertModel/BertEmbeddings/LayerNorm" in tags  # LayerNorm: a default torch.nn exception
    assert any(t.startswith("/BertModel/BertEncoder/BertLayer.1/BertAttention/") for t in tags)
    assert not any("/Linear" in t or "/Dropout" in t or "/ModuleList" in t for t in tags)
    # same-class siblings are told apart by attribute name
    assert "/BertModel/BertEmbeddings/Embedding.word_embeddings" in tags


@pytest.mark.sanity
def test_include_torch_nn_and_custom_exceptions() -> None:
    model = SmallCNN()
    default = ModuleTree(model)
    assert default.tag_of("features.0.bn") == "/SmallCNN/ConvBlock.0/BatchNorm2d"
    assert default.tag_of("features.0.conv") == "/SmallCNN/ConvBlock.0"  # Conv2d is not a level
    everything = ModuleTree(model, TagRules(include_torch_nn=True))
    assert everything.tag_of("features.0.conv") == "/SmallCNN/Sequential/ConvBlock.0/Conv2d"
    no_bn = ModuleTree(model, TagRules(torch_nn_exceptions=("Conv2d",)))
    assert no_bn.tag_of("features.0.conv") == "/SmallCNN/ConvBlock.0/Conv2d"
    assert no_bn.tag_of("features.0.bn") == "/SmallCNN/ConvBlock.0"


@pytest.mark.sanity
def test_hidden_containers_never_merge_distinct_modules() -> None:
    tree = ModuleTree(TwoStages())
    tags = {tree.tag_of(p) for p in ("stage1.0", "stage1.1", "stage2.0", "stage2.1")}
    assert len(tags) == 4
    assert tree.tag_of("stage2.1") == "/TwoStages/Sequential.stage2/Block.1"


@pytest.mark.sanity
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_module_called_twice(export_cache: Any, exporter: str) -> None:
    result = export_cache.get("torch-reuse_twice", ReuseTwice, exporter=exporter, verify_topology=True)
    sidecar = json.loads(result.hierarchy_path.read_text())
    assert sidecar["modules"]["block"]["call_count"] == 2
    assert sidecar["modules"]["block.fc"]["call_count"] == 2
    tags = node_tags(result)
    block_nodes = [t for t in tags if t.startswith("/ReuseTwice/Block")]
    # both calls' Gemm/MatMul and LayerNorm carry the block's tags
    assert sum(1 for t in block_nodes if t == "/ReuseTwice/Block/LayerNorm") >= 2
    assert len(block_nodes) >= 6


@pytest.mark.sanity
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mlp", {"/Sequential/Linear.0", "/Sequential/ReLU.1", "/Sequential/Linear.3"}),
        ("cnn_bn", {"/SmallCNN", "/SmallCNN/ConvBlock.0", "/SmallCNN/ConvBlock.2"}),
        ("lstm", {"/LSTMClassifier", "/LSTMClassifier/Embedding"}),
    ],
)
def test_plain_models_get_meaningful_tags(export_cache: Any, name: str, expected: set[str]) -> None:
    result = export_cache.get(
        f"torch-{name}", TORCH_MODELS[name], exporter="torchscript", verify_topology=True
    )
    assert expected <= set(node_tags(result))
    assert result.coverage["coverage_pct"] == 100.0


@pytest.mark.sanity
def test_sidecar_module_info_and_tensor_tags(tiny_bert_export: Any) -> None:
    side = json.loads(tiny_bert_export.hierarchy_path.read_text())
    layer = side["modules"]["encoder.layer.0"]
    assert layer["class"] == "BertLayer" and layer["tag"] == "/BertModel/BertEncoder/BertLayer.0"
    assert "hidden_states" in layer["forward_args"]
    assert layer["call_count"] == 1
    assert layer["parameters"]["direct"] == []
    assert "attention.self.query.weight" in layer["parameters"]["inherited"]
    assert side["modules"]["encoder.layer.0.output.LayerNorm"]["parameters"]["direct"] == ["weight", "bias"]
    assert side["modules"]["encoder"]["children"] == {"layer": "ModuleList"}
    # a tensor used by several modules lists all of them (R13): the extended attention mask
    multi = [t for t in side["tensors"].values() if len(t["consumers"]) >= 2]
    assert any(
        sum(c.startswith("/BertModel/BertEncoder/BertLayer.") for c in t["consumers"]) >= 2 for t in multi
    ), "some tensor should feed both BertLayers"
    for name, t in side["tensors"].items():
        if t["kind"] == "activation":
            assert t["producer"], name


@pytest.mark.sanity
def test_tag_helpers() -> None:
    assert parse_tag("/A/B.0/C") == ["A", "B.0", "C"]
    with pytest.raises(ValueError):
        parse_tag("A/B")
    assert common_ancestor({"/A/B/C", "/A/B/D", "/A/B"}) == "/A/B"
    assert common_ancestor({"/A/B", "/X"}) is None


@pytest.mark.sanity
def test_propagated_nodes_take_their_consumers_common_ancestor(export_cache: Any) -> None:
    result = export_cache.get(
        "hf-bert", lambda: tiny_hf_model("bert"), exporter="torchscript", verify_topology=True
    )
    side = json.loads(result.hierarchy_path.read_text())
    propagated = [n for n in side["nodes"].values() if n["source"] == "propagated"]
    assert propagated, "torchscript leaves unscoped nodes to propagate"
    assert all(n["module"] is None for n in propagated)
    assert any(n["tag"] != "/BertModel" for n in propagated), "propagation should reach below the root"


@pytest.mark.sanity
def test_propagation_goes_to_consumers_first_then_producers() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c"]),  # feeds A and B: their common ancestor
        helper.make_node("MatMul", ["x", "c"], ["a"]),  # /M/A
        helper.make_node("MatMul", ["a", "c"], ["b"]),  # /M/B
        helper.make_node("Relu", ["b"], ["r"]),  # no consumer: its producer's tag
        helper.make_node("Identity", ["z"], ["island"]),  # no tagged neighbour: left for the caller
    ]
    tags = {1: "/M/A", 2: "/M/B"}
    assert sorted(propagate_tags(nodes, tags)) == [0, 3]
    assert tags == {0: "/M", 1: "/M/A", 2: "/M/B", 3: "/M/B"}


@pytest.mark.sanity
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_torch_nn_only_model_is_not_collapsed_to_its_root(export_cache: Any, exporter: str) -> None:
    """Every node used to be tagged /Shared: its children (a Linear called twice, a Sequential) become levels."""
    result = export_cache.get("torch-shared", TORCH_MODELS["shared"], exporter=exporter, verify_topology=True)
    tags = node_tags(result)
    assert set(tags) == {"/Shared/Linear.proj", "/Shared/Sequential.mix"}
    assert tags.count("/Shared/Linear.proj") >= 2  # both calls
    side = json.loads(result.hierarchy_path.read_text())
    assert side["modules"]["proj"]["is_tag_level"] and side["modules"]["proj"]["call_count"] == 2
    assert not side["modules"]["mix.0"]["is_tag_level"]  # inside a level the torch.nn filter still applies


@pytest.mark.sanity
def test_reveal_leaves_models_whose_kept_modules_hold_most_nodes() -> None:
    tree = ModuleTree(SmallCNN())
    assert tree.reveal({"features.0.conv": 3, "features.2.conv": 3, "head": 1, "": 1}) == []
    assert tree.tag_of("head") == "/SmallCNN"
    assert tree.reveal({"features.0.conv": 1, "head": 3, "dropout": 1}) == ["dropout", "head"]
    assert tree.tag_of("head") == "/SmallCNN/Linear.head"
    assert tree.tag_of("features.0.bn") == "/SmallCNN/ConvBlock.0/BatchNorm2d"  # existing levels unchanged
