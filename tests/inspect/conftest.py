"""Fixtures for the inspect tests: a module called twice, damaged files, and the extraction proof helpers.

The proof: forward hooks capture a torch module's inputs and outputs; the extracted subgraph runs in
ONNX Runtime on those inputs; its outputs must equal the module's within 1e-4.

Binding subgraph inputs to the module's forward arguments: each subgraph input is matched to a
captured argument tensor of the same shape and dtype, the closest in value to what the full ONNX
model computes for that tensor on the same model input. Boundary tensors that are not forward
arguments (shape values, masks computed outside the module) are taken from that full-model run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from modelexport.inspect.extract import extract_module_subgraph


@pytest.fixture(scope="session")
def reuse_export(export_cache: Any) -> tuple[Any, Any]:
    """(the ReuseTwice module, its export): ``block`` is called twice, so its tag covers two call sites."""
    import torch

    from tests.models.torch_models import ReuseTwice

    torch.manual_seed(0)
    module = ReuseTwice().eval()
    return module, export_cache.get("reuse_twice", module)


@pytest.fixture()
def bad_files(tmp_path: Path, tiny_bert_export: Any) -> dict[str, Path]:
    """A missing path, a text file, a truncated model and an empty file."""
    data = Path(tiny_bert_export.onnx_path).read_bytes()
    files = {
        "missing": tmp_path / "nope.onnx",
        "text": tmp_path / "notes.onnx",
        "truncated": tmp_path / "cut.onnx",
        "empty": tmp_path / "empty.onnx",
    }
    files["text"].write_text("this is not an onnx model\n" * 20)
    files["truncated"].write_bytes(data[: len(data) // 2])
    files["empty"].write_bytes(b"")
    return files


def flat_tensors(value: Any) -> list[Any]:
    """Tensors inside nested tuples/lists/dicts/ModelOutputs, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict) or hasattr(value, "to_tuple"):
        value = list(value.values()) if isinstance(value, dict) else list(value.to_tuple())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    return []


def capture_calls(module: Any, run: Any) -> list[tuple[list[Any], list[Any]]]:
    """(input tensors, output tensors) of every call of ``module`` while ``run()`` executes."""
    calls: list[tuple[list[Any], list[Any]]] = []

    def hook(mod: Any, args: Any, kwargs: Any, output: Any) -> None:
        ins = flat_tensors(list(args) + list(kwargs.values()))
        calls.append(([t.detach().clone() for t in ins], [t.detach().clone() for t in flat_tensors(output)]))

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return calls


def intermediate_values(
    model_path: Path, names: list[str], feed: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Values of any tensors of the full model on ``feed`` (intermediates exposed as extra outputs)."""
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    inferred = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    present = {o.name for o in model.graph.output}
    wanted = [n for n in names if n not in feed]
    if not wanted:
        return {n: feed[n] for n in names}
    for n in wanted:
        if n not in present:
            model.graph.output.append(inferred[n] if n in inferred else onnx.ValueInfoProto(name=n))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip(wanted, sess.run(wanted, feed), strict=True))
    return {**{n: feed[n] for n in names if n in feed}, **values}


def bind_inputs(
    sub: Any, captured: list[Any], reference: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], set[str]]:
    """Feed for the subgraph and the names that were bound to captured torch arguments."""
    feed, from_torch = {}, set()
    for inp in sub.model.graph.input:
        ref = reference[inp.name]
        cands = [t.numpy() for t in captured if tuple(t.shape) == ref.shape and t.numpy().dtype == ref.dtype]
        if cands:
            best = min(
                cands,
                key=lambda c: float(np.abs(c.astype(np.float64) - ref.astype(np.float64)).max(initial=0)),
            )
            feed[inp.name] = best
            from_torch.add(inp.name)
        else:
            feed[inp.name] = ref
    return feed, from_torch


def run_subgraph(sub: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from modelexport.runtime.session import create_session

    sess, _ = create_session(sub.model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feed), strict=True))


def assert_outputs_match(got: dict[str, np.ndarray], expected: list[Any], atol: float = 1e-4) -> float:
    """Every float torch output has a subgraph output of its shape within ``atol``; returns the worst diff."""
    worst = 0.0
    for t in expected:
        if not t.is_floating_point():
            continue
        want = t.numpy()
        diffs = [
            float(np.abs(v - want).max())
            for v in got.values()
            if v.shape == want.shape and v.dtype == want.dtype
        ]
        assert diffs, (
            f"no subgraph output of shape {want.shape}; outputs: { {k: v.shape for k, v in got.items()} }"
        )
        assert min(diffs) <= atol, f"max abs diff {min(diffs):.3g} > {atol}"
        worst = max(worst, min(diffs))
    return worst


def prove(
    root: Any,
    module: Any,
    example: dict[str, torch.Tensor],
    onnx_path: Path,
    target: str,
    call: int = 0,
    hierarchy: Any = None,
) -> tuple[Any, float]:
    """Extract ``target``, run it on ``module``'s captured inputs (call ``call``), compare with its outputs."""
    with torch.no_grad():
        calls = capture_calls(module, lambda: root(**example))
    sub = extract_module_subgraph(onnx_path, hierarchy, target, call=call)
    ins, outs = calls[call]
    names = [i.name for i in sub.model.graph.input]
    reference = intermediate_values(onnx_path, names, {k: v.numpy() for k, v in example.items()})
    feed, from_torch = bind_inputs(sub, ins, reference)
    assert from_torch, f"no subgraph input of {target} was bound to a captured torch argument"
    return sub, assert_outputs_match(run_subgraph(sub, feed), outs)


def spec_inputs(export: Any, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs following the export's own input specs (shape, dtype, range)."""
    specs = json.loads(Path(export.hierarchy_path).read_text())["export"]["input_specs"]
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for s in specs:
        if s["dtype"].startswith("int"):
            lo, hi = s["range"] or (0, 10)
            out[s["name"]] = torch.randint(int(lo), int(hi), s["shape"], generator=gen)
        else:
            out[s["name"]] = torch.randn(s["shape"], generator=gen)
    return out
