"""Tent: the ONNX -> torch interpreter matches ONNX Runtime, both Tent paths agree, entropy goes down."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from modelexport.errors import TestTimeError
from modelexport.testtime import BNAdapter, OnnxTorchModule, TestTimeEngine, TestTimePolicy, tent_adapt
from modelexport.testtime.aggregate import entropy
from modelexport.testtime.corruptions import corrupt
from modelexport.testtime.tail import STEP_EXAMPLES


class FlattenCNN(nn.Module):
    """An ordinary CNN: BatchNorm, max and average pooling, ``x.flatten(1)`` (Shape/Reshape in a dynamo export)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 8, 3),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AvgPool2d(2),
        )
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@pytest.fixture(scope="module")
def flatten_cnn() -> FlattenCNN:
    torch.manual_seed(0)
    model = FlattenCNN()
    with torch.no_grad():  # non-trivial running statistics, as after training
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def flatten_export(export_cache: Any, flatten_cnn: FlattenCNN) -> Any:
    """The default export (dynamo), BatchNorm kept: what a user passes to ``--ttt tent``."""
    return export_cache.get("tt_flatten_cnn", flatten_cnn, keep_batchnorm=True, input_shape=(2, 1, 8, 8))


@pytest.mark.must
def test_tent_runs_on_the_default_export_of_a_cnn_that_flattens(
    flatten_export: Any, flatten_cnn: FlattenCNN
) -> None:
    adapter = BNAdapter(flatten_export.onnx_path)
    assert flatten_export.exporter == "dynamo"
    assert {"Shape", "Reshape", "BatchNormalization"} <= {n.op_type for n in adapter.source.graph.node}
    x = np.random.default_rng(1).normal(0.3, 1.5, (16, 1, 8, 8)).astype(np.float32)  # shifted test data
    with torch.no_grad():
        ours = OnnxTorchModule(adapter.source, train_bn=False)({"x": x})[0].numpy()
        batch_stats = OnnxTorchModule(adapter.source, train_bn=True)({"x": x})[0].numpy()
    np.testing.assert_allclose(ours, adapter.run({"x": x})[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        batch_stats, adapter.run({"x": x}, adapter.adapt({"x": x}))[0], rtol=1e-4, atol=1e-5
    )

    onnx_only = tent_adapt(adapter, {"x": x}, learning_rate=1e-2, steps=3)
    from_torch = tent_adapt(adapter, {"x": x}, learning_rate=1e-2, steps=3, torch_model=flatten_cnn)
    for name in onnx_only:
        np.testing.assert_allclose(onnx_only[name], from_torch[name], rtol=1e-3, atol=1e-4)
    changed = {k for k, v in onnx_only.items() if not np.array_equal(v, adapter.source_state[k])}
    assert changed == {p for layer in adapter.layers for p in layer.params}


@pytest.mark.must
def test_interpreter_matches_onnx_runtime(digits_export: Any, digits: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    x = digits.x_test[:50]
    module = OnnxTorchModule(adapter.source, train_bn=False)
    with torch.no_grad():
        ours = module({"x": x})[0].numpy()
    np.testing.assert_allclose(ours, adapter.run({"x": x})[0], rtol=1e-4, atol=1e-4)
    bn_state = adapter.adapt({"x": x})
    with torch.no_grad():
        train_mode = OnnxTorchModule(adapter.source, train_bn=True)({"x": x})[0].numpy()
    np.testing.assert_allclose(train_mode, adapter.run({"x": x}, bn_state)[0], rtol=1e-3, atol=1e-3)


@pytest.mark.must
def test_tent_from_onnx_equals_tent_from_the_torch_model(
    digits_export: Any, digits_cnn: Any, digits: Any
) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    feeds = {"x": corrupt(digits.x_test[:128], "contrast", 5)}
    onnx_only = tent_adapt(adapter, feeds, learning_rate=1e-2, steps=3)
    from_torch = tent_adapt(adapter, feeds, learning_rate=1e-2, steps=3, torch_model=digits_cnn)
    for name in onnx_only:
        np.testing.assert_allclose(onnx_only[name], from_torch[name], rtol=1e-3, atol=1e-4)
    changed = {k for k, v in onnx_only.items() if not np.array_equal(v, adapter.source_state[k])}
    assert changed == {
        p for layer in adapter.layers for p in layer.params
    }  # scale, bias, mean, var of each BN


@pytest.mark.must
def test_tent_lowers_prediction_entropy(digits_export: Any, digits: Any) -> None:
    adapter = BNAdapter(digits_export.onnx_path)
    feeds = {"x": corrupt(digits.x_test[:128], "blur", 5)}
    bn = adapter.adapt(feeds)
    tent = tent_adapt(adapter, feeds, learning_rate=1e-2, steps=5)

    def mean_entropy(state: dict) -> float:
        logits = adapter.run(feeds, state)[0]
        p = np.exp(logits - logits.max(1, keepdims=True))
        return float(entropy(p / p.sum(1, keepdims=True)).mean())

    assert mean_entropy(tent) < mean_entropy(bn)


@pytest.mark.sanity
def test_tent_engine_and_torch_model_safety(digits_export: Any, digits_cnn: Any, digits: Any) -> None:
    before = {k: v.clone() for k, v in digits_cnn.state_dict().items()}
    engine = TestTimeEngine(
        digits_export.onnx_path, TestTimePolicy(ttt="tent", ttt_iterations=2), torch_model=digits_cnn
    )
    probs = engine.predict({"x": digits.x_test[:64]})
    assert probs.shape == (64, 10)
    for k, v in digits_cnn.state_dict().items():
        assert torch.equal(v, before[k]), k  # the source torch model is adapted on a copy


@pytest.mark.sanity
def test_unsupported_operator_is_named(digits_export: Any) -> None:
    model = onnx.load(digits_export.onnx_path)
    model.graph.node[2].op_type = "Selu"  # the first Relu
    with pytest.raises(TestTimeError, match="Selu") as info:
        OnnxTorchModule(model)
    assert "torch_model" in info.value.hint


@pytest.mark.must
@pytest.mark.parametrize("statistics", ["batch", "memory"])
def test_tent_parameters_are_written_into_a_copy_of_the_model(
    digits_export: Any, digits: Any, statistics: str
) -> None:
    """The adapted copy run plainly predicts what the engine predicts. Batch statistics change every BN
    tensor. The memory statistics predict, then update (tail.py): a fresh stream's first batch is served
    with the source affine parameters and the stem layer's statistics (the batch mixed in); after a batch of
    STEP_EXAMPLES examples the last layer's scale/bias are stepped and the memory's statistics reach every layer."""
    import onnxruntime as ort

    from modelexport.testtime.graph import initializer_arrays

    feeds = {"x": corrupt(digits.x_test[:128], "contrast", 4)}
    policy = TestTimePolicy(ttt="tent", statistics=statistics, ttt_iterations=3, learning_rate=1e-2)
    engine = TestTimeEngine(digits_export.onnx_path, policy)
    stream = engine.new_stream()
    source = initializer_arrays(onnx.load(digits_export.onnx_path))
    layers = engine.adapter.layers  # type: ignore[union-attr]

    def changed(stream: Any) -> set[str]:
        adapted = engine.adapted_model(feeds, stream)
        after = initializer_arrays(adapted)
        plain = ort.InferenceSession(adapted.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_allclose(_softmax(plain), engine.predict(feeds, stream), rtol=1e-4, atol=1e-5)
        return {k for k in source if not np.array_equal(source[k], after[k])}

    if statistics == "batch":
        assert changed(stream) == {p for layer in layers for p in layer.params}
    else:
        assert changed(stream) == {layers[0].mean, layers[0].var}
        for _ in range(STEP_EXAMPLES // len(feeds["x"]) - 1):
            engine.predict(feeds, stream)
        assert stream.state is not None and set(stream.state) == {layers[-1].scale, layers[-1].bias}
        assert changed(stream) == {p for layer in layers for p in (layer.mean, layer.var)} | set(stream.state)
    with pytest.raises(TestTimeError, match="adapts nothing"):
        TestTimeEngine(digits_export.onnx_path).adapted_model(feeds)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.must
@pytest.mark.parametrize("layers", [1, 2, 0])
@pytest.mark.parametrize("model", ["digits", "flatten"])
def test_the_graph_tail_computes_what_onnx_runtime_computes(
    digits_export: Any, flatten_export: Any, digits: Any, model: str, layers: int
) -> None:
    """Fed the tensors one ONNX Runtime pass fetched, the tail from the last ``layers`` BN layers (0: all)
    computes that pass's output, under the statistics the pass normalised with (the stem layer's mixed with
    the batch), and its gradient reaches exactly the trained layers' scale/bias. The last layer's tail runs in
    numpy (``backprop.py``), with the logits and gradients (tent's step too) of the torch interpreter's; a
    longer one, through a convolution, in torch."""
    from modelexport.testtime.adapt import find_bn_layers
    from modelexport.testtime.backprop import torch_differentiable
    from modelexport.testtime.interpreter import OnnxTorchModule
    from modelexport.testtime.tail import Tail, _plan, tail_outputs
    from modelexport.testtime.tent import entropy_gradient, tent_step

    export = digits_export if model == "digits" else flatten_export
    source = onnx.load(export.onnx_path)
    output = source.graph.output[0].name
    adapter = BNAdapter(source, outputs=tail_outputs(source, find_bn_layers(source), layers, output))
    tail = Tail.build(adapter, output, layers)
    assert len(tail.layers) == (len(adapter.layers) if layers == 0 else layers)
    assert (tail.numpy is not None) == (layers == 1) and (tail.module is None) == (layers == 1)
    x = corrupt(digits.x_test[:32], "contrast", 3)
    state = adapter.statistics_feeds(None, None, 0.5)  # the stem mixes half the batch's own statistics
    want, _, fetched = adapter.run_with_statistics({"x": x}, state, output, tail.fetch)
    full = {**adapter.source_state, **state}
    inputs = dict(zip(tail.inputs, tail.gather({"x": x}, fetched), strict=True))
    assert all(
        len(a) == len(x) for a in inputs.values()
    )  # batched (shape arithmetic recomputed): buffers stack
    values, params = tail.statistics(full, fetched), tail.parameters(full)
    assert set(params) == {name for layer in tail.layers for name in (layer.scale, layer.bias)}
    differentiable = tail.differentiable(inputs, values)
    logits, vjp = differentiable(params)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
    grads = vjp(_softmax(logits))  # the gradient of the logits' summed log-sum-exp
    assert set(grads) == set(params) and all(np.abs(g).sum() > 0 for g in grads.values())
    if tail.numpy is not None:
        module = OnnxTorchModule(_plan(source, adapter.layers, layers, output)[0], train_bn=False)
        fed = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in {**inputs, **values}.items()}
        reference = torch_differentiable(lambda leaves: module({**fed, **leaves})[0])
        theirs, their_vjp = reference(params)
        np.testing.assert_allclose(logits, theirs, rtol=1e-5, atol=1e-5)
        for name, g in their_vjp(entropy_gradient(theirs)).items():
            np.testing.assert_allclose(vjp(entropy_gradient(logits))[name], g, rtol=1e-4, atol=1e-7)
        for name, p in tent_step(reference, params, 1e-3, 2).items():
            np.testing.assert_allclose(
                tent_step(differentiable, params, 1e-3, 2)[name], p, rtol=1e-5, atol=1e-7
            )


@pytest.mark.must
def test_the_written_out_adam_equals_torch_adam() -> None:
    from modelexport.testtime.tent import Adam

    torch.manual_seed(0)
    target = torch.randn(5)
    theirs = torch.randn(5, requires_grad=True)
    ours = {"p": theirs.detach().numpy().copy()}
    mine, reference = Adam(ours, 0.1), torch.optim.Adam([theirs], lr=0.1)
    for _ in range(7):
        grad = 4 * (torch.from_numpy(ours["p"]) - target) ** 3
        ours = mine.step(ours, {"p": grad.numpy()})
        reference.zero_grad()
        ((theirs - target) ** 4).sum().backward()
        reference.step()
    np.testing.assert_allclose(ours["p"], theirs.detach().numpy(), rtol=1e-6, atol=1e-7)
