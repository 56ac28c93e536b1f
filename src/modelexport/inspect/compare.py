"""``compare``: what changed between two models (fp32 vs int8, two export settings, two versions).

Structure: node and op counts, modules added or removed, per-module op-type deltas, inputs and
outputs, opset, initializer sizes. ``numeric``: both models run on the same inputs and each output's
max absolute and relative difference is reported.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InferenceError
from ..hierarchy.graph import ancestors_of
from ..runtime.session import create_session
from ..testtime.graph import add_outputs
from .extract import module_boundary
from .formats import renderer
from .inputs import generate_inputs, load_npz_inputs, run_session
from .loading import ModelLike, TaggedModel, load_tagged_model

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    import numpy as np
    import onnx
    import onnxruntime as ort

__all__ = ["ModelSummary", "Comparison", "compare", "compare_models", "numeric_diff"]


@dataclass
class ModelSummary:
    name: str
    opset: int
    nodes: int
    op_types: dict[str, int]
    module_ops: dict[str, dict[str, int]]
    inputs: list[str]
    outputs: list[str]
    initializers: int
    initializer_bytes: int


def _io(values: Iterable[onnx.ValueInfoProto]) -> list[str]:
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [
            d.dim_param or str(d.dim_value) if d.HasField("dim_value") or d.dim_param else "?"
            for d in t.shape.dim
        ]
        out.append(f"{v.name}: {_dtype_name(t.elem_type)}[{','.join(dims)}]")
    return out


def _dtype_name(elem_type: int) -> str:
    """``float``, ``int64``...; an element type ONNX does not define (a damaged file) by its number."""
    import onnx

    try:
        return onnx.helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()
    except (KeyError, ValueError):
        return f"type {elem_type}"


def summarize(tm: TaggedModel) -> ModelSummary:
    index = tm.index
    module_ops: dict[str, Counter[str]] = defaultdict(Counter)
    for tag, op in zip(index.tags, index.op_types, strict=True):
        module_ops[tag or "(untagged)"][op] += 1
    init_names = set(index.initializers)
    return ModelSummary(
        tm.name,
        tm.opset,
        len(index),
        dict(Counter(index.op_types)),
        {t: dict(c) for t, c in module_ops.items()},
        _io(v for v in tm.proto.graph.input if v.name not in init_names),
        _io(tm.proto.graph.output),
        len(index.initializers),
        sum(i.nbytes for i in index.initializers.values()),
    )


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, list[int]]:
    return {k: [a.get(k, 0), b.get(k, 0)] for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}


@dataclass
class Comparison:
    a: ModelSummary
    b: ModelSummary
    op_type_deltas: dict[str, list[int]]
    modules_added: list[str]
    modules_removed: list[str]
    module_op_deltas: dict[str, dict[str, list[int]]]
    tag_distribution: dict[str, list[int]]
    inputs_changed: bool
    outputs_changed: bool
    numeric: dict[str, dict[str, float]] | None = None
    #: With ``numeric``: per module of A (down to ``MODULE_DEPTH``), the largest difference over the tensors
    #: it hands to the rest of the graph (its ``extract`` boundary outputs) that B computes too.
    module_numeric: dict[str, dict[str, float]] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def identical_structure(self) -> bool:
        return not (
            self.op_type_deltas
            or self.modules_added
            or self.modules_removed
            or self.module_op_deltas
            or self.inputs_changed
            or self.outputs_changed
            or self.a.opset != self.b.opset
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "identical_structure": self.identical_structure}


def compare_models(a: TaggedModel, b: TaggedModel) -> Comparison:
    sa, sb = summarize(a), summarize(b)
    ta, tb = set(sa.module_ops), set(sb.module_ops)
    nodes_a = {t: sum(c.values()) for t, c in sa.module_ops.items()}
    nodes_b = {t: sum(c.values()) for t, c in sb.module_ops.items()}
    return Comparison(
        sa,
        sb,
        _delta(sa.op_types, sb.op_types),
        sorted(tb - ta),
        sorted(ta - tb),
        {t: d for t in sorted(ta & tb) if (d := _delta(sa.module_ops[t], sb.module_ops[t]))},
        _delta(nodes_a, nodes_b),
        sa.inputs != sb.inputs,
        sa.outputs != sb.outputs,
    )


#: ``module_numeric`` covers modules down to this depth (root = 1): the model, its parts and their layers.
MODULE_DEPTH = 3


def _session(
    model: onnx.ModelProto, data_dir: Path | None, providers: tuple[str, ...]
) -> ort.InferenceSession:
    # failures come back as exceptions (one-line InferenceError): keep ORT's own error log quiet
    folder = str(data_dir) if data_dir else None
    return create_session(model, providers=providers, log_severity_level=4, external_data_dir=folder)[0]


def _run_both(
    a: TaggedModel,
    b: TaggedModel,
    inputs: str | None,
    providers: tuple[str, ...],
    extra: list[str] | None = None,
) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
    """(A's outputs by name, B's outputs in order, B's outputs by name) on the same feeds.

    ``extra``: intermediate tensors exposed as outputs too. Weights kept on disk (``data_dir``) are read
    there by ONNX Runtime, so a model over 2 GB is never serialized as one protobuf.
    """
    sess_a = _session(add_outputs(a.proto, extra) if extra else a.proto, a.data_dir, providers)
    sess_b = _session(add_outputs(b.proto, extra) if extra else b.proto, b.data_dir, providers)
    feed = load_npz_inputs(inputs, sess_a) if inputs else generate_inputs(sess_a, a.sidecar, model=a.proto)
    names_b = [i.name for i in sess_b.get_inputs()]
    if sorted(names_b) != sorted(feed):
        raise InferenceError(
            f"the models take different inputs: {sorted(feed)} vs {sorted(names_b)}; numeric comparison needs the same"
        )
    out_a = dict(zip([o.name for o in sess_a.get_outputs()], run_session(sess_a, feed), strict=True))
    out_b_list = run_session(sess_b, feed)
    return out_a, out_b_list, dict(zip([o.name for o in sess_b.get_outputs()], out_b_list, strict=True))


def _difference(va: np.ndarray, vb: np.ndarray | None) -> dict[str, float]:
    import numpy as np

    if vb is None or np.shape(va) != np.shape(vb):
        return {"max_abs": float("inf"), "max_rel": float("inf")}
    diff = np.abs(np.asarray(va, np.float64) - np.asarray(vb, np.float64))
    rel = diff / np.maximum(np.abs(np.asarray(va, np.float64)), 1e-12)
    return {"max_abs": float(diff.max(initial=0.0)), "max_rel": float(rel.max(initial=0.0))}


def numeric_diff(
    a: TaggedModel, b: TaggedModel, inputs: str | None = None, providers: tuple[str, ...] = ()
) -> dict[str, dict[str, float]]:
    """Run both models on the same inputs; per output of A: max abs and max relative difference to B."""
    out_a, out_b_list, out_b = _run_both(a, b, inputs, providers)
    return {
        name: _difference(va, out_b.get(name, out_b_list[pos] if pos < len(out_b_list) else None))
        for pos, (name, va) in enumerate(out_a.items())
    }


def module_numeric_diff(
    a: TaggedModel, b: TaggedModel, inputs: str | None = None, providers: tuple[str, ...] = ()
) -> dict[str, dict[str, float]]:
    """Per module of A: max abs/rel difference over its boundary outputs that B also computes (by name).

    Both models expose those tensors as extra outputs and run on the same feeds, so the error shows
    where it enters (an int8 model usually keeps its float activations' names), not only at the end.
    """
    tags = [t for t in a.index.all_tags if len(ancestors_of(t)) <= MODULE_DEPTH]
    in_b = set(b.index.producer)
    cut = {t: [x for x in module_boundary(a.proto, a.index, t)["outputs"] if x in in_b] for t in tags}
    cut = {t: names for t, names in cut.items() if names}
    names = sorted({x for v in cut.values() for x in v})
    out_a, _, out_b = _run_both(a, b, inputs, providers, names)
    result = {}
    for tag, tensors in cut.items():
        diffs = [_difference(out_a[x], out_b.get(x)) for x in tensors]
        result[tag] = {
            "max_abs": max(d["max_abs"] for d in diffs),
            "max_rel": max(d["max_rel"] for d in diffs),
            "tensors": len(tensors),
        }
    return result


def compare(
    model_a: ModelLike,
    model_b: ModelLike,
    *,
    numeric: bool = False,
    inputs: str | None = None,
    providers: tuple[str, ...] = (),
) -> Comparison:
    """Compare two models (paths, folders or ModelProtos); ``numeric`` also runs both."""
    # weights stored as external data stay on disk: ONNX Runtime reads them there (models over 2 GB)
    a = load_tagged_model(model_a, weights=numeric, external_data=False)
    b = load_tagged_model(model_b, weights=numeric, external_data=False)
    result = compare_models(a, b)
    if numeric:
        result.numeric = numeric_diff(a, b, inputs, providers)
        result.module_numeric = module_numeric_diff(a, b, inputs, providers)
    return result


# -- renderers -----------------------------------------------------------------------------------
def _lines(c: Comparison) -> list[str]:
    a, b = c.a, c.b
    out = [
        f"A: {a.name}",
        f"B: {b.name}",
        f"nodes: {a.nodes} -> {b.nodes}; opset: {a.opset} -> {b.opset}; initializers: {a.initializers} "
        f"({a.initializer_bytes:,} B) -> {b.initializers} ({b.initializer_bytes:,} B)",
        f"structure identical: {'yes' if c.identical_structure else 'no'}",
    ]
    if c.inputs_changed:
        out.append(f"inputs: {a.inputs} -> {b.inputs}")
    if c.outputs_changed:
        out.append(f"outputs: {a.outputs} -> {b.outputs}")
    if c.op_type_deltas:
        out.append("op types: " + ", ".join(f"{k} {x}->{y}" for k, (x, y) in c.op_type_deltas.items()))
    out += [f"module added: {t}" for t in c.modules_added] + [
        f"module removed: {t}" for t in c.modules_removed
    ]
    for tag, d in c.module_op_deltas.items():
        out.append(f"module {tag}: " + ", ".join(f"{k} {x}->{y}" for k, (x, y) in d.items()))
    for name, d in (c.numeric or {}).items():
        out.append(f"output {name}: max abs diff {d['max_abs']:.3g}, max rel diff {d['max_rel']:.3g}")
    for tag, d in (c.module_numeric or {}).items():
        out.append(f"module {tag}: boundary max abs diff {d['max_abs']:.3g} ({d['tensors']} tensor(s))")
    return out + [f"note: {n}" for n in c.notes]


@renderer("compare", "text")
def _text(c: Comparison) -> str:
    return "\n".join(_lines(c)) + "\n"


@renderer("compare", "markdown")
def _markdown(c: Comparison) -> str:
    rows = ["# Model comparison", "", "| | A | B |", "|---|---|---|"]
    rows += [
        f"| model | `{c.a.name}` | `{c.b.name}` |",
        f"| nodes | {c.a.nodes} | {c.b.nodes} |",
        f"| opset | {c.a.opset} | {c.b.opset} |",
    ]
    rows += [
        f"| initializer bytes | {c.a.initializer_bytes:,} | {c.b.initializer_bytes:,} |",
        "",
        "## Differences",
        "",
    ]
    rows += [f"- {line}" for line in _lines(c)[3:]]
    if c.module_op_deltas:
        rows += ["", "| module | op | A | B |", "|---|---|---|---|"]
        rows += [
            f"| `{t}` | {op} | {x} | {y} |" for t, d in c.module_op_deltas.items() for op, (x, y) in d.items()
        ]
    return "\n".join(rows) + "\n"


@renderer("compare", "json")
def _json(c: Comparison) -> str:
    return json.dumps(c.to_dict(), indent=2, default=str) + "\n"
