"""BN statistics adaptation in ONNX Runtime against PyTorch's train-mode BatchNorm; safety; errors."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from modelexport.errors import TestTimeError
from modelexport.testtime import POLICY_PRESETS, BNAdapter, TestTimeEngine, TestTimePolicy
from modelexport.testtime.graph import initializer_arrays


def _train_mode_stats(model: torch.nn.Module, x: np.ndarray) -> dict[str, np.ndarray]:
    """Batch mean / biased variance each BN layer sees in train mode (the reference)."""
    stats: dict[str, np.ndarray] = {}
    m = copy.deepcopy(model).eval()
    hooks = []
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.train()

            def hook(_mod: Any, inp: Any, _out: Any, name: str = name) -> None:
                t = inp[0].double()
                stats[f"{name}.running_mean"] = t.mean(dim=(0, 2, 3)).numpy()
                stats[f"{name}.running_var"] = t.var(dim=(0, 2, 3), unbiased=False).numpy()

            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        m(torch.from_numpy(x))
    return stats


@pytest.mark.must
def test_adaptation_equals_train_mode_batchnorm(digits_export: Any, digits_cnn: Any, digits: Any) -> None:
    x = digits.x_test[:100]
    adapter = BNAdapter(digits_export.onnx_path)
    assert len(adapter.layers) == 3
    state = adapter.adapt({"x": x})  # one pass per BN layer: exact
    ref = _train_mode_stats(digits_cnn, x)
    for name, value in ref.items():  # float32 convolutions in ORT vs PyTorch: ~3e-4 relative by layer 2
        np.testing.assert_allclose(state[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    one_pass = adapter.adapt({"x": x}, iterations=1)  # later layers still see source-normalized inputs
    assert not np.allclose(one_pass["features.1.1.running_mean"], ref["features.1.1.running_mean"], atol=1e-3)


@pytest.mark.must
def test_adapted_model_changes_exactly_the_bn_statistics(digits_export: Any, digits: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    state = adapter.adapt({"x": digits.x_test[:64]})
    source = onnx.load(digits_export.onnx_path)
    adapted = adapter.adapted_model(state)
    before, after = initializer_arrays(source), initializer_arrays(adapted)
    assert before.keys() == after.keys()
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    expected = {p for layer in adapter.layers for p in (layer.mean, layer.var)}
    assert changed == expected
    assert [n.op_type for n in adapted.graph.node] == [n.op_type for n in source.graph.node]
    # the adapted copy run plainly == the shared session run with the state
    import onnxruntime as ort

    x = digits.x_test[:64]
    plain = ort.InferenceSession(adapted.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(plain, adapter.run({"x": x}, state)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.must
def test_shared_session_is_never_modified(digits_export: Any, digits: Any) -> None:
    x = digits.x_test[:32]
    engine = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn"))
    source = engine.adapter.run({"x": x})[0]  # type: ignore[union-attr]
    a = engine.predict({"x": x})
    engine.predict({"x": np.clip(x * 0.2, 0, 1)})  # another client's batch, very different statistics
    np.testing.assert_allclose(engine.predict({"x": x}), a, rtol=1e-6)
    np.testing.assert_array_equal(engine.adapter.run({"x": x})[0], source)  # type: ignore[union-attr]


@pytest.mark.sanity
def test_momentum_blends_with_the_source(digits_export: Any, digits: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    feeds = {"x": digits.x_test[:64]}
    full = adapter.adapt(feeds, iterations=1)
    half = adapter.adapt(feeds, momentum=0.5, iterations=1)
    name = adapter.layers[0].mean
    np.testing.assert_allclose(
        half[name], 0.5 * adapter.source_state[name] + 0.5 * full[name], rtol=1e-5, atol=1e-6
    )


@pytest.mark.sanity
def test_streams_keep_state_only_when_not_episodic(digits_export: Any, digits: Any) -> None:
    x1, x2 = digits.x_test[:32], np.clip(digits.x_test[32:64] * 0.5, 0, 1)
    episodic = TestTimeEngine(digits_export.onnx_path, TestTimePolicy(ttt="bn", episodic=True))
    stream_engine = TestTimeEngine(
        digits_export.onnx_path, TestTimePolicy(ttt="bn", statistics="batch", momentum=0.5)
    )
    s1, s2 = stream_engine.new_stream(), stream_engine.new_stream()
    stream_engine.predict({"x": x1}, s1)
    after_two = stream_engine.predict({"x": x2}, s1)
    fresh = stream_engine.predict({"x": x2}, s2)
    assert s1.batches == 2 and s2.batches == 1
    assert not np.allclose(after_two, fresh)  # s1 remembers x1's statistics
    np.testing.assert_allclose(episodic.predict({"x": x2}), episodic.predict({"x": x2}), rtol=1e-6)


@pytest.mark.must
def test_bn_adaptation_on_a_model_without_batchnorm_says_so(mlp_export: Any) -> None:
    with pytest.raises(TestTimeError, match="no BatchNormalization nodes") as info:
        TestTimeEngine(mlp_export.onnx_path, TestTimePolicy(ttt="bn"))
    assert "does not have" in info.value.hint and "--tta-transforms" in info.value.hint  # no BN to keep


@pytest.mark.must
def test_bn_adaptation_on_a_cnn_exported_without_batchnorm_hints_keep_batchnorm(export_cache: Any) -> None:
    """BatchNorm folded into the convolutions at export: keeping it is the fix the hint names."""
    import torch

    from tests.models.torch_models import SmallCNN

    torch.manual_seed(0)
    folded = export_cache.get("cnn_bn_folded", SmallCNN)
    with pytest.raises(TestTimeError, match="no BatchNormalization nodes") as info:
        TestTimeEngine(folded.onnx_path, TestTimePolicy(ttt="bn"))
    assert "--keep-batchnorm" in info.value.hint


@pytest.mark.must
@pytest.mark.parametrize("policy", ["bn", "tent", "sar", "bn-exact", "bn-stream"])
def test_eight_threads_on_one_engine_equal_the_sequential_result(
    digits_export: Any, digits: Any, policy: str
) -> None:
    """Issue 31: eight threads adapt one engine at once, each along its own stream (several batches of 24,
    so tent and sar take gradient steps) and with single calls without a stream: every probability equals
    the sequential run's exactly."""
    from concurrent.futures import ThreadPoolExecutor

    from modelexport.testtime.corruptions import corrupt

    engine = TestTimeEngine(digits_export.onnx_path, POLICY_PRESETS[policy])
    batches = [corrupt(digits.x_test[i * 24 : (i + 1) * 24], "contrast", 1 + i % 5) for i in range(16)]
    clients = [batches[k::8] for k in range(8)]

    def serve(client: list[np.ndarray]) -> list[np.ndarray]:
        stream = engine.new_stream()
        return [engine.predict({"x": b}, stream) for b in client]

    alone = [serve(c) for c in clients]
    single = [engine.predict({"x": b}) for b in batches]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(serve, clients))
        single_together = list(pool.map(lambda b: engine.predict({"x": b}), batches))
    for a, t in zip(alone, together, strict=True):
        for x, y in zip(a, t, strict=True):
            np.testing.assert_array_equal(y, x)
    for x, y in zip(single, single_together, strict=True):
        np.testing.assert_array_equal(y, x)
