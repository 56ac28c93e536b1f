"""Each pass of quantize/optimize alone on a real tiny BERT export, the pass runner, and the presets.

Every pass must keep tag coverage at 100% and the outputs within tolerance of its input model, and
a pass that declares ``in_place=False`` must leave its input untouched.
"""

from __future__ import annotations

import ast
import dataclasses
from inspect import signature
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelexport.errors import ConfigError, OptimizationError
from modelexport.hierarchy.passes import FunctionPass, Pass, PassResult, run_passes
from modelexport.hierarchy.tags import TAG_KEY, set_node_tag
from modelexport.metadata import read_metadata
from modelexport.optimize.calibration import load_samples
from modelexport.optimize.carry import CarryMetadata
from modelexport.optimize.config import (
    OPTIMIZE_PRESETS,
    QUANT_MODES,
    QUANTIZE_PRESETS,
    OptimizeConfig,
    QuantizeConfig,
)
from modelexport.optimize.graph import GRAPH_PASSES, GraphPass, optimize_model
from modelexport.optimize.quantization import DropShapeHints, Preprocess, QuantizeMode, quantize
from modelexport.optimize.retag import Retagged, RetagPass, tag_coverage
from modelexport.runtime.session import GRAPH_LEVEL_ALIASES, GRAPH_LEVELS, SessionConfig, create_session
from tests.optimize.conftest import bert_feeds

SRC = Path(__file__).resolve().parents[2] / "src" / "modelexport"
#: max abs diff vs the input: fp32 rewrites; tanh-approximated Gelu; float16 compute.
ATOL_FP32, ATOL_GELU, ATOL_FP16 = 1e-4, 5e-3, 2e-2
MIN_COSINE = 0.99
#: One config per graph pass that turns on that pass only.
ALONE = {
    "ort": OptimizeConfig(level="extended"),
    "transformer_fusion": OptimizeConfig(level="disable", transformer_fusion=True),
    "fp16": OptimizeConfig(level="disable", fp16=True),
    "simplify": OptimizeConfig(level="disable", simplify=True),
}


def _outputs(model: onnx.ModelProto) -> list[np.ndarray]:
    sess, _ = create_session(model)
    return [np.asarray(y, np.float32) for y in sess.run(None, bert_feeds(2, seed=5))]


def _max_diff(a: onnx.ModelProto, b: onnx.ModelProto) -> float:
    return max(float(np.abs(u - v).max()) for u, v in zip(_outputs(a), _outputs(b), strict=True))


def _cosine(a: onnx.ModelProto, b: onnx.ModelProto) -> float:
    u, v = _outputs(a)[0].ravel(), _outputs(b)[0].ravel()
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


@pytest.fixture(scope="module")
def bert(tiny_bert_onnx: Path) -> onnx.ModelProto:
    return onnx.load(str(tiny_bert_onnx))


def _check_pass(p: Pass, model: onnx.ModelProto) -> PassResult:
    """Run ``p`` on a copy; coverage 100%, and an input left as it was unless the pass says in_place."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    before = work.SerializeToString()
    result = p(work)
    assert isinstance(p, Pass) and dataclasses.is_dataclass(result)
    assert tag_coverage(result.model)["coverage_pct"] == 100.0, p.name
    if p.in_place:
        assert result.model is work, f"{p.name} declares in_place but returned another model"
    else:
        assert work.SerializeToString() == before, f"{p.name} changed its input"
    return result


# --- the runner -------------------------------------------------------------------------------


def _tiny() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    set_node_tag(node, "/Net/Act", "scope")
    return helper.make_model(helper.make_graph([node], "g", [x], [y]))


@pytest.mark.sanity
def test_run_passes_records_each_step_and_names_the_failing_pass() -> None:
    def add_identity(model: onnx.ModelProto) -> PassResult:
        new = onnx.ModelProto()
        new.CopyFrom(model)
        new.graph.node[0].output[0] = "r"
        new.graph.node.append(helper.make_node("Identity", ["r"], ["y"], name="id"))
        return PassResult(new, True, {"added": 1})

    model, steps = run_passes(_tiny(), [Retagged(FunctionPass("add_identity", add_identity))])
    assert [(s.name, s.nodes_before, s.nodes_after, s.changed) for s in steps] == [
        ("add_identity", 1, 2, True)
    ]
    assert steps[0].record["added"] == 1 and steps[0].record["retag"]["coverage_pct"] == 100.0
    assert {p.key: p.value for p in model.graph.node[1].metadata_props}[TAG_KEY] == "/Net/Act"
    with pytest.raises(dataclasses.FrozenInstanceError):
        steps[0].name = "x"  # type: ignore[misc]

    def broken(model: onnx.ModelProto) -> PassResult:
        raise RuntimeError("boom")

    with pytest.raises(OptimizationError, match="pass 'broken' failed: RuntimeError: boom"):
        run_passes(_tiny(), [FunctionPass("broken", broken)], wrap=OptimizationError)
    with pytest.raises(ValueError, match="changes its input"):
        Retagged(RetagPass(_tiny()))


# --- quantize steps, each alone ------------------------------------------------------------------


@pytest.mark.must
def test_preprocess_pass_alone(bert: onnx.ModelProto) -> None:
    result = _check_pass(Retagged(Preprocess()), bert)
    assert result.changed and result.record["retag"]["coverage_pct"] == 100.0
    assert _max_diff(bert, result.model) <= ATOL_FP32


@pytest.mark.sanity
def test_drop_shape_hints_pass_alone(bert: onnx.ModelProto) -> None:
    inits = {t.name for t in bert.graph.initializer}
    shadowing = [vi.name for vi in bert.graph.value_info if vi.name in inits]
    result = _check_pass(DropShapeHints(), bert)
    assert shadowing and result.changed and result.record == {"dropped": len(shadowing)}
    assert not inits & {vi.name for vi in result.model.graph.value_info}
    assert len(result.model.graph.value_info) == len(bert.graph.value_info) - len(shadowing)
    again = DropShapeHints()(result.model)
    assert not again.changed and again.model is result.model


@pytest.mark.must
@pytest.mark.parametrize("mode", list(QUANT_MODES))
def test_quantize_mode_pass_alone(
    bert: onnx.ModelProto, tiny_bert_onnx: Path, bert_npz: Path, mode: str
) -> None:
    samples = load_samples(str(bert_npz), bert, tiny_bert_onnx, 8) if mode == "static" else None
    p = Retagged(QuantizeMode(QuantizeConfig(mode=mode, progress=False), samples=samples))
    result = _check_pass(p, bert)
    assert p.name == f"quantize_{mode}" and result.record["excluded_nodes"] == 0
    assert _cosine(bert, result.model) >= MIN_COSINE


@pytest.mark.sanity
def test_carry_metadata_pass_alone(bert: onnx.ModelProto) -> None:
    target = onnx.ModelProto()
    target.CopyFrom(bert)
    target.ClearField("metadata_props")
    result = _check_pass(CarryMetadata(bert, "modelexport.test", {"x": 1}), target)
    meta = read_metadata(result.model)
    assert set(read_metadata(bert)) < set(meta) and meta["modelexport.test"] == {"x": 1}


# --- graph passes, each alone -------------------------------------------------------------------


@pytest.mark.must
def test_every_graph_pass_has_a_config_that_runs_it_alone() -> None:
    assert set(ALONE) == set(GRAPH_PASSES)
    for name, cfg in ALONE.items():
        assert [n for n, (applies, _) in GRAPH_PASSES.items() if applies(cfg)] == [name]


@pytest.mark.must
@pytest.mark.parametrize("name", list(ALONE))
def test_graph_pass_alone(bert: onnx.ModelProto, name: str) -> None:
    if name == "ort":  # control: ORT's optimizer drops node metadata, so without Retagged tags are lost
        assert tag_coverage(GraphPass(name, ALONE[name])(bert).model)["coverage_pct"] < 100.0
    result = _check_pass(Retagged(GraphPass(name, ALONE[name])), bert)
    assert result.record["retag"]["coverage_pct"] == 100.0 and "stats" in result.record
    assert _max_diff(bert, result.model) <= (ATOL_FP16 if name == "fp16" else ATOL_FP32)


# --- presets ------------------------------------------------------------------------------------


@pytest.mark.optimum
@pytest.mark.sanity
def test_quantize_presets_match_optimums_auto_quantization_config() -> None:
    from onnxruntime.quantization import QuantType
    from optimum.onnxruntime import AutoQuantizationConfig

    names = {QuantType.QInt8: "int8", QuantType.QUInt8: "uint8"}
    for name in QUANTIZE_PRESETS:
        ours = QuantizeConfig.preset(name)
        factory = getattr(AutoQuantizationConfig, name)
        static = {"is_static": ours.mode == "static"} if "is_static" in signature(factory).parameters else {}
        theirs = factory(**static)
        assert theirs.is_static == (ours.mode == "static"), name
        assert (ours.weight_type, ours.activation_type) == (
            names[theirs.weights_dtype],
            names[theirs.activations_dtype],
        ), name
        assert (ours.per_channel, ours.reduce_range) == (theirs.per_channel, theirs.reduce_range), name
        assert ours.preset_name == name and ours.record()["preset_name"] == name
    for mode in QUANT_MODES:
        assert QuantizeConfig.preset(mode).mode == mode
    assert QuantizeConfig.preset("avx512_vnni", mode="static").mode == "static"
    with pytest.raises(ConfigError, match="quantize preset must be one of"):
        QuantizeConfig.preset("avx9000")
    with pytest.raises(ConfigError, match="unknown quantize option"):
        QuantizeConfig.preset("arm64", colour="red")


@pytest.mark.optimum
@pytest.mark.sanity
def test_optimization_levels_match_optimums_auto_optimization_config() -> None:
    from optimum.onnxruntime import AutoOptimizationConfig

    ort_levels = {0: "disable", 1: "basic", 2: "extended", 99: "all"}
    for name, ours in OPTIMIZE_PRESETS.items():
        theirs = AutoOptimizationConfig.with_optimization_level(name, for_gpu=name == "O4")
        assert ours.level == ort_levels[theirs.optimization_level], name
        assert ours.transformer_fusion == theirs.enable_transformers_specific_optimizations, name
        assert ours.approximate_gelu == theirs.enable_gelu_approximation, name
        assert ours.fp16 == theirs.fp16, name
    cfg = OptimizeConfig.preset("o2", simplify=True)
    assert (cfg.preset_name, cfg.level, cfg.transformer_fusion, cfg.simplify) == (
        "O2",
        "extended",
        True,
        True,
    )
    with pytest.raises(ConfigError, match="optimization preset must be one of O1, O2, O3, O4"):
        OptimizeConfig.preset("O5")
    with pytest.raises(ConfigError, match="transformer fusion option"):
        OptimizeConfig(approximate_gelu=True)


@pytest.mark.must
@pytest.mark.parametrize("name", ["O1", "O2", "O3"])
def test_optimization_levels_keep_tags_and_outputs(tiny_bert_onnx: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.onnx"
    result = optimize_model(tiny_bert_onnx, out, OptimizeConfig.preset(name))
    model = onnx.load(str(out))
    assert result.coverage["coverage_pct"] == 100.0
    assert [p.name for p in result.passes] == (["ort"] if name == "O1" else ["transformer_fusion", "ort"])
    ops = {n.op_type for n in model.graph.node}
    assert ("FastGelu" in ops) == (name == "O3")
    assert read_metadata(model)["modelexport.optimization"]["preset_name"] == name
    atol = ATOL_GELU if name == "O3" else ATOL_FP32
    assert _max_diff(onnx.load(str(tiny_bert_onnx)), model) <= atol


@pytest.mark.sanity
@pytest.mark.parametrize("name", [n for n in QUANTIZE_PRESETS if n != "tensorrt"])
def test_cpu_quantize_presets_keep_tags_and_outputs(tiny_bert_onnx: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.onnx"
    result = quantize(tiny_bert_onnx, out, QuantizeConfig.preset(name, progress=False))
    assert result.coverage["coverage_pct"] == 100.0
    assert [p["name"] for p in result.to_dict()["passes"]] == [
        "quant_pre_process",
        "drop_initializer_shape_hints",
        "plain_matmul",
        "quantize_dynamic",
        "carry_metadata",
    ]
    assert read_metadata(out)["modelexport.quantization"]["preset_name"] == name
    assert _cosine(onnx.load(str(tiny_bert_onnx)), onnx.load(str(out))) >= MIN_COSINE


# --- one vocabulary, downward imports -----------------------------------------------------------


@pytest.mark.sanity
def test_graph_levels_are_ort_names_with_none_as_an_alias() -> None:
    assert list(GRAPH_LEVELS) == ["disable", "basic", "extended", "all"]
    for alias, name in GRAPH_LEVEL_ALIASES.items():
        assert SessionConfig(graph_optimization_level=alias).graph_optimization_level == name
        assert OptimizeConfig(level=alias, fp16=True).level == name
    with pytest.raises(ConfigError, match="level must be one of disable, basic, extended, all, none"):
        OptimizeConfig(level="max")


def _local_package_imports(path: Path) -> list[str]:
    """``from .x import y`` (or ``modelexport.x``) inside a function body of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                own = isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").startswith("modelexport")
                )
                if own:
                    found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.must
def test_optimize_has_no_function_local_imports_of_the_package() -> None:
    files = [*sorted((SRC / "optimize").glob("*.py")), SRC / "hierarchy" / "passes.py"]
    assert [hit for f in files for hit in _local_package_imports(f)] == []
    config = ast.parse((SRC / "optimize" / "config.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(config) if isinstance(n, ast.ImportFrom)}
    assert "quantization" not in imported and "graph" not in imported
