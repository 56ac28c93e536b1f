"""The session factory: ordered providers with CPU last, one warning, fallback that records, options applied."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from modelexport.errors import ConfigError, OnnxFileError
from modelexport.runtime import SessionConfig, create_session, resolve_providers
from modelexport.runtime import session as session_mod

CPU = "CPUExecutionProvider"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    path = tmp_path_factory.mktemp("rt") / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    return path


@pytest.mark.must
def test_order_keeps_preference_and_appends_cpu_last() -> None:
    order, skipped = resolve_providers(["tensorrt", "cuda", "cpu"], available=["CUDAExecutionProvider", CPU])
    assert order == ["CUDAExecutionProvider", CPU] and skipped == ["TensorrtExecutionProvider"]
    assert resolve_providers(None, available=[CPU]) == ([CPU], [])
    with pytest.raises(ConfigError, match="unknown execution provider"):
        resolve_providers(["warp-drive"], available=[CPU])


@pytest.mark.must
def test_unavailable_providers_one_warning_and_cpu_runs(
    model_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="modelexport")
    sess, info = create_session(model_file, providers=("tensorrt", "cuda"))
    assert info.provider == CPU and info.active == [CPU] and info.fell_back
    assert info.skipped_unavailable == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    warnings = [r for r in caplog.records if "not available" in r.getMessage()]
    assert len(warnings) == 1 and CPU in warnings[0].getMessage()
    x = np.array([[-1, 2, -3, 4]], dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [[0, 4, 0, 8]])
    assert info.to_dict()["provider"] == CPU


@pytest.mark.sanity
def test_failing_provider_is_recorded_then_cpu(model_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mock: this machine has no GPU, so CUDA is *reported* available to exercise the recorded fallback."""
    monkeypatch.setattr(session_mod, "available_providers", lambda: ["CUDAExecutionProvider", CPU])
    real = ort.InferenceSession

    def fake(model, sess_options=None, providers=None, provider_options=None, **kwargs):  # noqa: ANN001
        if providers and providers[0] == "CUDAExecutionProvider":
            raise RuntimeError("CUDA driver not found")
        seen.append(kwargs.get("disabled_optimizers"))
        return real(model, sess_options, providers, provider_options, **kwargs)

    seen: list[object] = []

    monkeypatch.setattr(ort, "InferenceSession", fake)
    _, info = create_session(model_file, providers=["cuda"])
    assert info.tried == ["CUDAExecutionProvider", CPU]
    assert "CUDA driver not found" in info.errors["CUDAExecutionProvider"] and info.provider == CPU
    assert seen == [["SkipLayerNormFusion"]]  # the CPU fallback runs as a CPU-only session


@pytest.mark.must
def test_options_level_threads_and_optimized_model_file(model_file: Path, tmp_path: Path) -> None:
    sess, _ = create_session(model_file)
    assert sess.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    cached = tmp_path / "optimized.onnx"
    cfg = SessionConfig(
        graph_optimization_level="basic",
        intra_op_num_threads=1,
        inter_op_num_threads=1,
        optimized_model_filepath=str(cached),
    )
    sess, _ = create_session(model_file, cfg)
    opts = sess.get_session_options()
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert opts.intra_op_num_threads == 1 and opts.inter_op_num_threads == 1
    assert cached.is_file()
    reused, _ = create_session(cached)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(reused.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])


@pytest.mark.sanity
def test_bad_config_and_bad_files(model_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="graph_optimization_level"):
        SessionConfig(graph_optimization_level="max")
    with pytest.raises(ConfigError, match="thread"):
        SessionConfig(intra_op_num_threads=-1)
    with pytest.raises(OnnxFileError, match="not found"):
        create_session(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(OnnxFileError, match="not an ONNX model"):
        create_session(junk)
    sess, _ = create_session(model_file.parent)  # an export folder works too
    assert [i.name for i in sess.get_inputs()] == ["x"]
