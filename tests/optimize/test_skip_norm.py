"""Skip-normalization split for the CPU provider (SkipLayerNormalization and its RMS form): exact, tagged, kept
where its extra outputs are read, and kept out of CPU sessions (ORT would fuse it back). Speed is measured in
benchmarks/kernel_choice.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelexport.optimize.config import OptimizeConfig
from modelexport.optimize.graph import optimize_model
from modelexport.optimize.skip_norm import KEPT_FOR_DECODING, kept_for, split_skip_layer_norms
from modelexport.runtime.session import CPU_DISABLED_OPTIMIZERS, SessionConfig, create_session

HIDDEN = 16


def _fused_graph(bias: bool, outputs: tuple[str, ...], op: str = "SkipLayerNormalization") -> onnx.ModelProto:
    """x + skip (+ bias) -> ``op`` -> Relu; ``outputs`` of the fused node are graph outputs."""
    rng = np.random.default_rng(0)
    params = ("gamma", "beta") if op == "SkipLayerNormalization" else ("gamma",)  # RMS: no beta
    inits = [
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), name)
        for name in (*params, *(("bias",) if bias else ()))
    ]
    names = ["y", "mean", "inv_std", "sum"]
    node = helper.make_node(
        op,
        ["x", "skip", *(i.name for i in inits)],
        names,
        name="sln",
        domain="com.microsoft",
        epsilon=1e-5,
    )
    relu = helper.make_node("Relu", ["y"], ["out"], name="relu")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, HIDDEN]) for n in ("x", "skip")]
    shapes = {"mean": [2, 3, 1], "inv_std": [2, 3, 1]}  # the statistics keep the normalized axis as 1
    graph_out = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes.get(n, [2, 3, HIDDEN]))
        for n in ("out", *outputs)
    ]
    graph = helper.make_graph([node, relu], "g", io, graph_out, inits)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def _run(model: onnx.ModelProto, **config: object) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 3, HIDDEN)).astype(np.float32) for n in ("x", "skip")}
    return create_session(model, SessionConfig(**config))[0].run(None, feeds)


@pytest.mark.smoke
@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("bias", [False, True])
def test_split_equals_the_fused_op_and_keeps_tensor_names(bias: bool, op: str) -> None:
    fused = _fused_graph(bias, ("sum",), op)  # the residual sum is read downstream, as in every layer
    result = split_skip_layer_norms(fused)
    assert (result.split, result.kept) == (1, 0)
    ops = Counter(n.op_type for n in result.model.graph.node)
    norm = op.removeprefix("Skip")
    assert ops == Counter({"Add": 2 if bias else 1, norm: 1, "Relu": 1})
    assert [n.op_type for n in fused.graph.node] == [op, "Relu"]  # input untouched
    if op == "SkipLayerNormalization":  # ORT's RMS op is not in onnx's schema registry
        onnx.checker.check_model(result.model)
    expected, got = _run(fused), _run(result.model)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)


@pytest.mark.smoke
def test_a_node_whose_mean_output_is_read_stays_fused() -> None:
    result = split_skip_layer_norms(_fused_graph(False, ("mean",)))
    assert (result.split, result.kept) == (0, 1)
    assert "SkipLayerNormalization" in {n.op_type for n in result.model.graph.node}


@pytest.mark.smoke
def test_cpu_sessions_leave_out_ort_skip_layer_norm_fusion(tmp_path: Path) -> None:
    """Add + LayerNormalization stays two ops in a CPU session (ORT would fuse them back); asked for, it fuses."""
    split = split_skip_layer_norms(_fused_graph(False, ())).model
    ops = {}
    for label, disabled in (("default", None), ("none disabled", ())):
        out = tmp_path / f"{label}.onnx"
        _run(split, disabled_optimizers=disabled, optimized_model_filepath=str(out))
        ops[label] = {n.op_type for n in onnx.load(out).graph.node}
    assert CPU_DISABLED_OPTIMIZERS == ("SkipLayerNormFusion",)
    assert "SkipLayerNormalization" not in ops["default"] and "LayerNormalization" in ops["default"]
    assert "SkipLayerNormalization" in ops["none disabled"]


@pytest.mark.sanity
def test_o4_keeps_skip_norms_fused_for_gpus_and_o2_splits_them(tiny_bert_onnx: Path, tmp_path: Path) -> None:
    assert OptimizeConfig.preset("O4").skip_norm_fusion and not OptimizeConfig.preset("O2").skip_norm_fusion
    kept = tmp_path / "kept.onnx"
    result = optimize_model(tiny_bert_onnx, kept, OptimizeConfig.preset("O2", skip_norm_fusion=True))
    ops = Counter(n.op_type for n in onnx.load(kept).graph.node)
    assert ops["SkipLayerNormalization"] == 4 and result.coverage["coverage_pct"] == 100.0
    assert "skip_layer_norm" not in result.passes[0].record["stats"]


@pytest.mark.smoke
def test_a_graph_with_a_cache_keeps_the_rms_form_fused() -> None:
    """A graph that takes ``past_key_values.*`` runs mostly one-token steps, where ORT's RMS skip kernel is the
    faster: it stays fused there (counted as kept), the LayerNorm form is still split; other graphs split both."""
    rms = _fused_graph(False, (), "SkipSimplifiedLayerNormalization")
    assert kept_for(rms) == frozenset()
    cached = onnx.ModelProto()
    cached.CopyFrom(rms)
    cached.graph.input.append(helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1]))
    assert kept_for(cached) == KEPT_FOR_DECODING
    kept = split_skip_layer_norms(rms, kept_for(cached))
    assert (kept.split, kept.kept) == (0, 1) and kept.model.graph.node[
        0
    ].op_type == "SkipSimplifiedLayerNormalization"
    layer_norm = split_skip_layer_norms(_fused_graph(False, ()), kept_for(cached))
    assert (layer_norm.split, layer_norm.kept) == (1, 0)
