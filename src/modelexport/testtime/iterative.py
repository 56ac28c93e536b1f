"""Iterative inference: feed chosen outputs back as inputs for N steps, outside or inside ONNX Runtime.

``iterate`` is the external loop (one session run per step). ``build_loop_model`` wraps the model's graph
into an ONNX ``Loop`` so all steps run inside one ``session.run``; the fed-back inputs become loop-carried
values and every other input and initializer is read from the outer scope. Both stop early when the
largest change of a fed-back value falls below ``tol``, and give the same final fed-back outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._config import split_names
from .._numeric import softmax
from ..errors import TestTimeError
from .engine import TestTimeEngine
from .graph import ModelLike, load_model
from .streams import Stream

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["IterationResult", "Iteration", "LOOPS", "iterate", "build_loop_model", "LOOP_STEPS_OUTPUT"]

#: Extra output of a Loop model: how many steps ran (int64 scalar).
LOOP_STEPS_OUTPUT = "loop_steps"


@dataclass(frozen=True)
class IterationResult:
    """Final outputs (by name) and the number of steps that ran."""

    outputs: dict[str, np.ndarray]
    steps: int


def _check_feedback(model: onnx.ModelProto, feedback: dict[str, str], steps: int) -> None:
    if steps < 1:
        raise TestTimeError(f"steps must be >= 1, got {steps}")
    if not feedback:
        raise TestTimeError("feedback must map at least one output name to an input name")
    outputs = [o.name for o in model.graph.output]
    inputs = [i.name for i in model.graph.input]
    bad_out = [o for o in feedback if o not in outputs]
    bad_in = [i for i in feedback.values() if i not in inputs]
    if bad_out or bad_in:
        raise TestTimeError(
            f"feedback names not in the model: outputs {bad_out}, inputs {bad_in}; outputs: {outputs}, inputs: {inputs}"
        )


def iterate(
    session: ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    feedback: dict[str, str],
    steps: int,
    tol: float | None = None,
) -> IterationResult:
    """External loop: run, copy ``feedback`` outputs into their inputs, repeat up to ``steps`` times."""
    names = [o.name for o in session.get_outputs()]
    current = dict(feeds)
    outputs: dict[str, np.ndarray] = {}
    for step in range(1, steps + 1):
        outputs = dict(zip(names, session.run(names, current), strict=True))
        delta = max(float(np.max(np.abs(outputs[o] - current[i]))) for o, i in feedback.items())
        current.update({i: outputs[o] for o, i in feedback.items()})
        if tol is not None and delta < tol:
            return IterationResult(outputs, step)
    return IterationResult(outputs, steps)


def _value_info(name: str, like: onnx.TypeProto) -> onnx.ValueInfoProto:
    """A value info with the type (and shape) of a fed-back input: carried values keep their type."""
    vi = onnx.ValueInfoProto(name=name)
    vi.type.CopyFrom(like)
    return vi


def _body(model: onnx.ModelProto, feedback: dict[str, str], tol: float | None) -> onnx.GraphProto:
    """The model's nodes as a Loop body: carried inputs and every produced tensor renamed into the body scope."""
    carried = {i: f"{i}__loop_in" for i in feedback.values()}
    produced = {o: f"{o}__loop" for n in model.graph.node for o in n.output if o}
    rename = {**carried, **produced}
    nodes = []
    for node in model.graph.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[:] = [rename.get(i, i) for i in node.input]
        new.output[:] = [rename.get(o, o) for o in node.output]
        nodes.append(new)
    types = {i.name: i.type for i in model.graph.input}
    cond_out = "loop_cond__out"
    if tol is None:
        nodes.append(helper.make_node("Identity", ["loop_cond__in"], [cond_out]))
    else:
        deltas = []
        for k, (out, inp) in enumerate(feedback.items()):
            d = f"loop_delta_{k}"
            nodes += [
                helper.make_node("Sub", [produced[out], carried[inp]], [f"{d}_sub"]),
                helper.make_node("Abs", [f"{d}_sub"], [f"{d}_abs"]),
                helper.make_node("ReduceMax", [f"{d}_abs"], [d], keepdims=0),
            ]
            deltas.append(d)
        nodes += [
            helper.make_node("Max", deltas, ["loop_delta"])
            if len(deltas) > 1
            else helper.make_node("Identity", deltas, ["loop_delta"]),
            helper.make_node("CastLike", ["loop_tol", "loop_delta"], ["loop_tol_t"]),
            helper.make_node("GreaterOrEqual", ["loop_delta", "loop_tol_t"], [cond_out]),
        ]
    inputs = [
        helper.make_tensor_value_info("loop_iter", TensorProto.INT64, []),
        helper.make_tensor_value_info("loop_cond__in", TensorProto.BOOL, []),
        *[_value_info(carried[i], types[i]) for i in feedback.values()],
    ]
    nodes.append(helper.make_node("Identity", ["loop_iter"], ["loop_iter__out"]))
    outputs = [
        helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
        *[_value_info(produced[o], types[i]) for o, i in feedback.items()],
        helper.make_tensor_value_info("loop_iter__out", TensorProto.INT64, []),  # scan output: one per step
    ]
    return helper.make_graph(nodes, "loop_body", inputs, outputs)


def build_loop_model(
    model: ModelLike, feedback: dict[str, str], steps: int, tol: float | None = None
) -> onnx.ModelProto:
    """A model running ``steps`` refinement steps in one ONNX ``Loop``; outputs: the fed-back outputs and ``loop_steps``."""
    src = load_model(model)
    _check_feedback(src, feedback, steps)
    types = {i.name: i.type for i in src.graph.input}
    inits = [
        *src.graph.initializer,
        numpy_helper.from_array(np.array(steps, dtype=np.int64), "loop_max_steps"),
        numpy_helper.from_array(np.array(True), "loop_cond_init"),
        numpy_helper.from_array(np.array(tol if tol is not None else 0.0, dtype=np.float32), "loop_tol"),
    ]
    loop = helper.make_node(
        "Loop",
        ["loop_max_steps", "loop_cond_init", *feedback.values()],
        [*feedback.keys(), "loop_iters"],
        body=_body(src, feedback, tol),
        name="test_time_loop",
    )
    count = helper.make_node("Size", ["loop_iters"], [LOOP_STEPS_OUTPUT])
    outputs = [
        *[_value_info(o, types[i]) for o, i in feedback.items()],
        helper.make_tensor_value_info(LOOP_STEPS_OUTPUT, TensorProto.INT64, []),
    ]
    graph = helper.make_graph([loop, count], f"{src.graph.name}_loop", list(src.graph.input), outputs, inits)
    out = helper.make_model(graph, opset_imports=list(src.opset_import), ir_version=src.ir_version)
    out.functions.extend(src.functions)
    out.metadata_props.extend(src.metadata_props)
    onnx.checker.check_model(out)
    return out


#: How iterative inference runs: one session run per step (``iterate``), or all steps in one ONNX ``Loop``.
LOOPS = ("external", "onnx")


@dataclass(frozen=True)
class Iteration:
    """Iterative inference: feed ``feedback`` outputs back into their inputs for up to ``steps`` steps (the
    fed-back inputs start at the data's values, or at zeros where a processor's feeds lack them), stopping
    early when the largest change is below ``tol``."""

    steps: int
    feedback: dict[str, str]
    loop: str = "external"
    tol: float | None = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise TestTimeError(f"--iterate must be >= 1 steps, got {self.steps}")
        if not self.feedback:
            raise TestTimeError(
                "--iterate needs --feedback OUTPUT:INPUT (which output feeds which input)",
                hint="e.g. --feedback logits:prev_logits",
            )
        if self.loop not in LOOPS:
            raise TestTimeError(f"--loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")

    @classmethod
    def parse(cls, steps: int, feedback: str, loop: str = "external", tol: float | None = None) -> Iteration:
        """``--feedback out:in[,out2:in2]`` as a mapping."""
        pairs = [p.split(":", 1) for p in split_names(feedback)]
        bad = [":".join(p) for p in pairs if len(p) != 2 or not all(p)]
        if bad:
            raise TestTimeError(
                f"--feedback takes OUTPUT:INPUT pairs, got {bad}", hint="e.g. logits:prev_logits"
            )
        return cls(steps, {o: i for o, i in pairs}, loop, tol)

    def model(self, path: ModelLike) -> ModelLike:
        """The model the engine runs: the file, or its ONNX ``Loop`` of the steps."""
        return build_loop_model(path, self.feedback, self.steps, self.tol) if self.loop == "onnx" else path

    def start(self, feeds: dict[str, np.ndarray], engine: TestTimeEngine) -> dict[str, np.ndarray]:
        """``feeds`` with each fed-back input at zeros (its dynamic axes sized from the batch)."""
        n = len(next(iter(feeds.values())))
        out = dict(feeds)
        for vi in engine.inputs:
            if vi.name in self.feedback.values() and vi.name not in feeds:
                dims = [d.dim_value if d.HasField("dim_value") else n for d in vi.type.tensor_type.shape.dim]
                dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
                out[vi.name] = np.zeros(dims, dtype=dtype)
        return out

    def run(self, engine: TestTimeEngine, feeds: dict[str, np.ndarray], stream: Stream) -> Any:
        """The final fed-back output as probabilities (external loop), or the Loop model's engine result."""
        feeds = self.start(feeds, engine)
        if self.loop == "onnx":
            return engine.run(feeds, stream)
        result = iterate(engine.session, feeds, self.feedback, self.steps, self.tol)
        return softmax(result.outputs[next(iter(self.feedback))].astype(np.float32), -1)
