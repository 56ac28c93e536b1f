"""A seeded mutation generator for ONNX files: byte-level damage, protobuf structure edits, semantic edits.

Kept in the tests (not a corpus of files) so every run can draw new mutants from a seed. Each mutant is
(name, bytes); the name says what was done, so a failing case can be rebuilt from its seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import onnx

from modelexport.hierarchy.tags import TAG_KEY
from modelexport.metadata import schema
from modelexport.onnxfile._wire import encode_varint, iter_fields, len_field

__all__ = ["MUTATORS", "mutants"]

Mutator = Callable[[random.Random, bytes], tuple[str, bytes]]

#: Field numbers of sub-messages worth descending into: ModelProto.graph (7), GraphProto.node (1),
#: .initializer (5), .input (11), .output (12), .value_info (13), NodeProto.attribute (5),
#: ValueInfoProto.type (2), TypeProto.tensor_type (1), .shape (2), .dim (1), metadata_props (14).
_NESTED = {7, 1, 5, 11, 12, 13, 2, 14}


def _truncate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    cut = rng.randrange(1, len(data))
    return f"truncate@{cut}", data[:cut]


def _bit_flips(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    out = bytearray(data)
    positions = [rng.randrange(len(out)) for _ in range(rng.randint(1, 8))]
    for pos in positions:
        out[pos] ^= 1 << rng.randrange(8)
    return f"bitflip@{positions}", bytes(out)


def _overwrite(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    out = bytearray(data)
    start = rng.randrange(len(out))
    length = min(rng.choice([1, 2, 4, 16, 64]), len(out) - start)
    fill = rng.choice([b"\xff", b"\x00", b"\x80", None])
    out[start : start + length] = fill * length if fill else rng.randbytes(length)
    return f"overwrite@{start}+{length}:{fill!r}", bytes(out)


def _zeros(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    return "zero-filled", bytes(len(data))


def _fields(buf: bytes, start: int, end: int) -> list:
    try:
        return list(iter_fields(buf, start, end))
    except ValueError:
        return []


def _pick_path(rng: random.Random, data: bytes) -> list[int]:
    """Indices of nested fields, from the top-level message down to a random field."""
    path: list[int] = []
    start, end = 0, len(data)
    while True:
        fields = _fields(data, start, end)
        if not fields:
            return path
        index = rng.randrange(len(fields))
        path.append(index)
        f = fields[index]
        if f.wire != 2 or f.number not in _NESTED or rng.random() < 0.3:
            return path
        start, end = f.payload, f.end


def _leaf_edit(rng: random.Random, data: bytes, f) -> tuple[str, bytes]:
    key = f.number << 3
    payload = data[f.payload : f.end]
    choice = rng.randrange(7)
    if choice == 0:
        return "delete", b""
    if choice == 1:
        return "duplicate", data[f.start : f.end] * 2
    if choice == 2:  # a wrong wire type for the same field number
        wire = rng.choice([w for w in (0, 1, 2, 5) if w != f.wire])
        return f"wire{f.wire}->{wire}", encode_varint(key | wire) + data[f.payload : f.end]
    if choice == 3:  # an unknown enum value / huge or negative int where a varint was
        value = rng.choice([0, 99, 1 << 20, (1 << 63) - 1, (1 << 64) - 1, 10**12])
        return f"varint={value}", encode_varint(key) + encode_varint(value)
    if choice == 4 and f.wire == 2:  # a length running past the enclosing message
        extra = rng.choice([1, 7, 1 << 20, 1 << 40])
        return f"length+{extra}", encode_varint(key | 2) + encode_varint(len(payload) + extra) + payload
    if choice == 5 and f.wire == 2:  # invalid UTF-8 where a string may be
        return "bad-utf8", len_field(f.number, b"\xff\xfe" + payload[2:])
    return "random-payload", encode_varint(key | f.wire) + rng.randbytes(len(data[f.payload : f.end]) or 1)


def _rebuild(rng: random.Random, data: bytes, start: int, end: int, path: list[int]) -> tuple[str, bytes]:
    fields = _fields(data, start, end)
    index = path[0]
    out = [data[f.start : f.end] for f in fields]
    target = fields[index]
    if len(path) == 1:
        what, out[index] = _leaf_edit(rng, data, target)
    else:
        what, inner = _rebuild(rng, data, target.payload, target.end, path[1:])
        out[index] = len_field(target.number, inner)
    return f"{target.number}.{what}", b"".join(out)


def _structure(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    path = _pick_path(rng, data)
    if not path:
        return _truncate(rng, data)
    what, out = _rebuild(rng, data, 0, len(data), path)
    return f"struct:{what}", out


def _semantic(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """Well-formed protobuf with values no valid model has."""
    model = onnx.ModelProto.FromString(data)
    graph = model.graph
    edits: dict[str, Callable[[], None]] = {
        "dtype": lambda: setattr(
            rng.choice(graph.initializer), "data_type", rng.choice([0, 17, 99, 1 << 20])
        ),
        "elem_type": lambda: setattr(
            graph.input[0].type.tensor_type, "elem_type", rng.choice([0, 99, 1 << 20])
        ),
        "huge_dim": lambda: (
            graph.input[0]
            .type.tensor_type.shape.dim[rng.randrange(4)]
            .__setattr__("dim_value", rng.choice([10**12, -5, 1 << 40]))
        ),
        "init_dims": lambda: rng.choice(graph.initializer).dims.__setitem__(0, rng.choice([10**9, -1, 0])),
        "raw_data": lambda: setattr(rng.choice(graph.initializer), "raw_data", b"\x01\x02\x03"),
        "op_type": lambda: setattr(
            rng.choice(graph.node), "op_type", rng.choice(["Nope", "", "Conv\x00", "Loop", "If", "Scan"])
        ),
        "opset": lambda: setattr(model.opset_import[0], "version", rng.choice([0, 10**6])),
        "ir_version": lambda: setattr(model, "ir_version", rng.choice([1, 10**9])),
        "external": lambda: _external(rng, rng.choice(graph.initializer)),
        "attr_type": lambda: _attr_type(rng, graph),
        "dangling": lambda: rng.choice(graph.node).input.append("no_such_tensor"),
        "metadata": lambda: setattr(rng.choice(model.metadata_props), "value", rng.choice(["", "{", "[1,"])),
        "tamper": lambda: _tamper(rng, model),
        "dup_init": lambda: graph.initializer.append(rng.choice(graph.initializer)),
        "huge_init": lambda: _huge_initializer(rng, rng.choice(graph.initializer)),
        "unknown_init": lambda: _unknown_initializer(rng, graph),
        "self_call": lambda: _self_calling_function(rng, model),
        "deep_tag": lambda: _deep_tag(rng, rng.choice(graph.node)),
        "shape_hint": lambda: _shape_hint(rng, graph),
    }
    name = rng.choice(sorted(edits))
    edits[name]()
    return f"semantic:{name}", model.SerializeToString()


def _external(rng: random.Random, tensor: onnx.TensorProto) -> None:
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    location = rng.choice(["../outside.bin", "/etc/passwd", "missing.bin", "", "a/../../x.bin"])
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="length", value=rng.choice(["16", "-1", "99999999999"]))


#: The embedded metadata's keys a tamper edits (modelexport.metadata.schema), and what it writes.
_TAMPERS = {
    schema.KEY_TASK: "text-classification",
    schema.KEY_MODEL_CONFIG: '{"id2label":{"0":"evil"}}',
    schema.KEY_CHECKSUM: "sha256:" + "0" * 64,
}


def _tamper(rng: random.Random, model: onnx.ModelProto) -> None:
    """Edit, remove or replace a signed metadata entry without re-signing (what ``quantize`` must not carry)."""
    props = {p.key: p for p in model.metadata_props}
    key = rng.choice(sorted(props))
    if rng.random() < 0.3:
        model.metadata_props.remove(props[key])
    else:
        props[key].value = _TAMPERS.get(key, props[key].value + " ")


def _huge_initializer(rng: random.Random, tensor: onnx.TensorProto) -> None:
    """Dims far larger than the data (2^31 x 2^31 once made the quantizer try to reshape 64 values)."""
    del tensor.dims[:]
    tensor.dims.extend(rng.choice([[1 << 31, 1 << 31], [1 << 62], [0, 1 << 40]]))


def _unknown_initializer(rng: random.Random, graph: onnx.GraphProto) -> None:
    node = rng.choice([n for n in graph.node if len(n.input) > 1] or list(graph.node))
    node.input[-1] = rng.choice(["weight_nope", "", node.output[0]])


def _self_calling_function(rng: random.Random, model: onnx.ModelProto) -> None:
    """A model-local function whose body calls itself, used by one node."""
    from onnx import helper

    call = helper.make_node("F", ["a"], ["b"], domain="local")
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("local", 1)]
    model.functions.append(helper.make_function("local", "F", ["a"], ["b"], [call], opsets))
    model.opset_import.append(helper.make_opsetid("local", 1))
    node = rng.choice([n for n in model.graph.node if len(n.input) == 1] or list(model.graph.node))
    node.op_type, node.domain = "F", "local"


def _deep_tag(rng: random.Random, node: onnx.NodeProto) -> None:
    """A hierarchy tag of hundreds or thousands of levels (analyze was quadratic in depth)."""
    tag = "/A" * rng.choice([200, 257, 5000]) + rng.choice(["", "/" + "x" * 20_000])
    props = {p.key: p for p in node.metadata_props}
    if TAG_KEY in props:
        props[TAG_KEY].value = tag
    else:
        node.metadata_props.add(key=TAG_KEY, value=tag)


def _shape_hint(rng: random.Random, graph: onnx.GraphProto) -> None:
    """A value_info or output shape that contradicts what shape inference finds."""
    infos = [v for v in (*graph.value_info, *graph.output) if v.type.tensor_type.shape.dim]
    if infos:
        dims = rng.choice(infos).type.tensor_type.shape.dim
        dims[rng.randrange(len(dims))].dim_value = rng.choice([999, 1, 1 << 40])


def _attr_type(rng: random.Random, graph: onnx.GraphProto) -> None:
    nodes = [n for n in graph.node if n.attribute]
    if nodes:
        attr = rng.choice(nodes).attribute[0]
        attr.type = rng.choice([0, 4, 11])


MUTATORS: dict[str, Mutator] = {
    "truncate": _truncate,
    "bitflip": _bit_flips,
    "overwrite": _overwrite,
    "structure": _structure,
    "semantic": _semantic,
    "zeros": _zeros,
}
#: How often each mutator is drawn: structure edits reach the most code.
_WEIGHTS = {"truncate": 2, "bitflip": 3, "overwrite": 2, "structure": 6, "semantic": 4, "zeros": 1}


def mutants(data: bytes, seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` seeded mutants of ``data``: (description, bytes)."""
    rng = random.Random(seed)
    names = sorted(MUTATORS)
    weights = [_WEIGHTS[n] for n in names]
    for i in range(count):
        kind = rng.choices(names, weights)[0]
        what, out = MUTATORS[kind](rng, data)
        yield f"{seed}:{i}:{what}", out
