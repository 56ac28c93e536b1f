"""Weight-only int4/int8 quantization (``MatMulNBits``): the config and its refusals, the projection join alone on a
hand-made graph, the real all-MiniLM-L6-v2 encoder (tags, mixed precision, sentence-embedding cosine) and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelexport.cli.app import main
from modelexport.errors import ConfigError
from modelexport.hierarchy.tags import TAG_KEY, set_node_tag
from modelexport.inference.processors.text import load_tokenizer
from modelexport.optimize import WEIGHT_ALGORITHMS, QuantizeConfig, WeightOnlyConfig, quantize
from modelexport.optimize.config import quantize_config
from modelexport.optimize.projections import FuseProjections
from modelexport.runtime.session import create_session

SENTENCES = [
    "a gripping, funny and moving film",
    "the plot is thin and the acting worse",
    "i would watch it again tomorrow",
    "the soundtrack alone is worth the ticket",
    "two hours i will never get back",
    "an honest look at a family falling apart",
    "the jokes land more often than not",
    "it drags in the middle but the ending works",
]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(block_size=48), "power of two"),
        (dict(block_size=512), "power of two"),
        (dict(accuracy_level=5), "accuracy_level"),
        (dict(weights="int2"), "weights must be one of"),
        (dict(algorithm="awq"), "algorithm must be one of"),
        (dict(algorithm="hqq", weights="int8"), "hqq quantizes weights to int4"),
        (dict(algorithm="hqq", symmetric=True), "no symmetric form"),
        (dict(weights="int8", quantize_embeddings=True), "int4 only"),
        (dict(algorithm="hqq", quantize_embeddings=True), "cannot quantize embeddings"),
        (dict(calibration_data="texts.csv"), "needs no calibration data"),
        (dict(mixed_precision="some"), "mixed_precision must be one of"),
        (dict(weights="int8", mixed_precision="norm_inputs"), "every one already is"),
        (dict(calibration_samples=0), "calibration_samples"),
    ],
)
def test_config_refuses_bad_options_before_any_work(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WeightOnlyConfig(**changes)


def test_presets_and_defaults() -> None:
    """The default is onnxruntime-genai's CPU int4 format; each preset is a valid config and recorded."""
    cfg = WeightOnlyConfig.preset("int4")
    assert (cfg.weights, cfg.algorithm, cfg.block_size, cfg.symmetric, cfg.accuracy_level) == (
        "int4",
        "rtn",
        32,
        True,
        4,
    )
    assert cfg.quantize_lm_head and not cfg.quantize_embeddings and cfg.mixed_precision == "auto"
    assert WeightOnlyConfig.preset("int8").bits == 8
    assert WeightOnlyConfig.preset("int4_hqq").symmetric is False  # HQQ's zero points are its point
    assert WeightOnlyConfig.preset("int4_gptq", calibration_data="x.csv").calibrated
    record = WeightOnlyConfig.preset("int4", block_size=128).record()
    assert record["mode"] == "weight_only" and record["bits"] == 4 and record["preset_name"] == "int4"
    assert "calibration_data" not in record and "progress" not in record


def test_quantize_config_routes_the_options_and_names_those_of_the_other_kind() -> None:
    assert isinstance(quantize_config(weights="int4", block_size=64), WeightOnlyConfig)
    assert isinstance(quantize_config(preset="int4_hqq"), WeightOnlyConfig)
    assert isinstance(quantize_config(mode="static", per_channel=True), QuantizeConfig)
    assert isinstance(quantize_config(preset="avx512_vnni", exclude_modules=None), QuantizeConfig)
    with pytest.raises(ConfigError, match="--per-channel: int8 quantization options"):
        quantize_config(weights="int4", per_channel=True)
    with pytest.raises(ConfigError, match="--block-size, --symmetric: options of weight-only"):
        quantize_config(block_size=64, symmetric=False)


def test_every_registered_algorithm_has_a_generation_test() -> None:
    from tests.generation.test_weight_only import ALGORITHMS

    assert set(WEIGHT_ALGORITHMS) == set(ALGORITHMS)


# ------------------------------------------------------------------------------------------ the join, alone
def _siblings_graph() -> onnx.ModelProto:
    """x -> three MatMuls (q/k/v-like, 16 -> 24, 8, 8) tagged as one attention, and one MatMul on another input."""
    rng = np.random.default_rng(0)
    weights = {f"w{i}": rng.standard_normal((16, n)).astype(np.float32) for i, n in enumerate((24, 8, 8, 16))}
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "w1"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "w2"], ["v"], name="v_proj"),
        helper.make_node("MatMul", ["y", "w3"], ["o"], name="o_proj"),
    ]
    for node in nodes[:3]:
        set_node_tag(node, "/Model/Layer.0/Attention")
    set_node_tag(nodes[3], "/Model/Layer.0/Output")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 16]) for n in ("x", "y")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q", "k", "v", "o")],
        [numpy_helper.from_array(w, name) for name, w in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_fuse_projections_joins_siblings_exactly_and_tags_the_shared_module() -> None:
    model = _siblings_graph()
    result = FuseProjections(frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}))(model)
    assert result.changed and result.record["joined"] == 1
    ops = [(n.op_type, n.name) for n in result.model.graph.node]
    assert ops == [("MatMul", "q_proj_joined"), ("Split", "q_proj_joined_split"), ("MatMul", "o_proj")]
    tags = {n.name: {p.key: p.value for p in n.metadata_props}[TAG_KEY] for n in result.model.graph.node}
    assert tags["q_proj_joined"] == tags["q_proj_joined_split"] == "/Model/Layer.0/Attention"
    assert len(model.graph.node) == 4  # the input is untouched
    feeds = {n: np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32) for n in ("x", "y")}
    before = create_session(model)[0].run(None, feeds)
    after = create_session(result.model)[0].run(None, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    unchanged = FuseProjections(frozenset({"q_proj", "o_proj"}))(model)  # one sibling named: nothing to join
    assert not unchanged.changed


# --------------------------------------------------------------------------------------- a real encoder
def _embeddings(path: Path, tokenizer: Any) -> np.ndarray:
    session = create_session(path)[0]
    names = [i.name for i in session.get_inputs()]
    enc = tokenizer(SENTENCES, padding=True, return_tensors="np")
    hidden = session.run(None, {k: enc[k].astype(np.int64) for k in names})[0]
    mask = enc["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def minilm_int4(minilm_export: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("minilm_int4") / "model.onnx"
    return out, quantize(minilm_export.onnx_path, out, WeightOnlyConfig(progress=False))


def test_minilm_int4_is_tagged_mixed_and_keeps_its_sentence_embeddings(
    minilm_export: Any, minilm_int4: tuple[Path, Any]
) -> None:
    """Default int4 on an encoder: every projection quantized (the pooler's Gemm too, as a MatMul), those that read
    a LayerNorm (q/k/v joined, the intermediate) at int8, tags 100%, the weights in model.onnx.data; the real MiniLM's sentence embeddings stay
    within cosine 0.98 of fp32 (README: 0.991 mean on 872 SST-2 sentences)."""
    path, result = minilm_int4
    assert result.coverage["coverage_pct"] == 100.0 and result.retag["coverage_pct"] == 100.0
    model = onnx.load(path, load_external_data=False)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    bits = sorted(next(a.i for a in n.attribute if a.name == "bits") for n in nbits)
    assert len(nbits) == 6 * 4 + 1 and bits.count(8) == 6 * 2 and bits.count(4) == 6 * 2 + 1
    pooler = [n for n in nbits if {p.key: p.value for p in n.metadata_props}[TAG_KEY].endswith("/BertPooler")]
    assert len(pooler) == 1
    assert all(next(a.i for a in n.attribute if a.name == "accuracy_level") == 4 for n in nbits)
    assert (path.parent / "model.onnx.data").is_file() and path.stat().st_size < 2_000_000
    record = json.loads({p.key: p.value for p in model.metadata_props}["modelexport.quantization"])
    assert record["mixed_precision_applied"] == "norm_inputs" and record["int8_matmuls"] == 12
    sidecar = json.loads((path.parent / "model_hierarchy.json").read_text())
    assert sidecar["coverage"]["coverage_pct"] == 100.0 and sidecar["transforms"][-1]["kind"] == "quantize"
    tokenizer = load_tokenizer(Path(minilm_export.onnx_path).parent)
    cosine = (_embeddings(path, tokenizer) * _embeddings(Path(minilm_export.onnx_path), tokenizer)).sum(1)
    assert cosine.mean() >= 0.98 and cosine.min() >= 0.95


def test_cli_quantize_weights_writes_a_package_and_refuses_to_replace_it(
    minilm_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "int8"
    args = [
        "quantize",
        str(minilm_export.onnx_path),
        "-o",
        f"{out}/",
        "--weights",
        "int8",
        "--format",
        "json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["settings"]["weights"] == "int8" and summary["settings"]["block_size"] == 32
    assert summary["coverage"]["coverage_pct"] == 100.0 and summary["size_ratio"] > 1.4
    assert {"model.onnx", "model.onnx.data", "model_hierarchy.json"} <= {p.name for p in out.iterdir()}
    assert main(args) == 1  # an existing package: refused without --overwrite
    assert "refusing to replace" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert main(["quantize", str(minilm_export.onnx_path), "-o", f"{tmp_path}/x/", "--weights", "int4",
                 "--per-channel"]) == 1  # fmt: skip
    assert "--per-channel: int8 quantization options" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_mixed_precision_none_keeps_every_weight_int4(
    minilm_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--mixed-precision none`` overrides ``auto`` (which keeps an encoder's LayerNorm readers at int8)."""
    out = tmp_path / "none"
    args = [
        "quantize",
        str(minilm_export.onnx_path),
        "-o",
        f"{out}/",
        "--weights",
        "int4",
        "--format",
        "json",
    ]
    assert main([*args, "--mixed-precision", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["mixed_precision"] == "none"
    model = onnx.load(out / "model.onnx", load_external_data=False)
    bits = {
        next(a.i for a in n.attribute if a.name == "bits")
        for n in model.graph.node
        if n.op_type == "MatMulNBits"
    }
    assert bits == {4}
    assert main([*args[:3], f"{tmp_path}/y/", "--weights", "int4", "--mixed-precision", "some"]) == 2


@pytest.mark.parametrize("attrs", [{}, {"transB": 1}, {"transB": 1, "beta": 0.5}])
def test_gemm_to_matmul_is_exact_and_keeps_the_tag(attrs: dict[str, Any]) -> None:
    """GPT-2's Conv1D layers export as Gemm: weight-only quantizers need a MatMul (+ Add for the bias)."""
    from modelexport.optimize.prepare import GemmToMatMul

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((24, 16) if attrs.get("transB") else (16, 24)).astype(np.float32)
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", **attrs)
    set_node_tag(gemm, "/Model/Block.0/MLP")
    graph = helper.make_graph(
        [gemm],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 24])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = GemmToMatMul()(model)
    assert [n.op_type for n in result.model.graph.node] == ["MatMul", "Add"] and result.record[
        "rewritten"
    ] == 1
    assert all(
        {p.key: p.value for p in n.metadata_props}[TAG_KEY] == "/Model/Block.0/MLP"
        for n in result.model.graph.node
    )
    x = {"x": rng.standard_normal((5, 16)).astype(np.float32)}
    np.testing.assert_allclose(
        create_session(result.model)[0].run(None, x)[0],
        create_session(model)[0].run(None, x)[0],
        rtol=1e-5,
        atol=1e-5,
    )
