"""Graph preparation quantizers run first: shape hints that go stale dropped, ``FusedMatMul`` on a constant weight
back to ``MatMul``, and (weight-only) ``Gemm`` to ``MatMul`` + ``Add``: quantizers only see ``MatMul``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hierarchy.passes import PassResult

if TYPE_CHECKING:
    import onnx

__all__ = ["DropShapeHints", "GemmToMatMul", "PlainMatMul"]


@dataclass(frozen=True)
class DropShapeHints:
    """A copy without ``value_info`` entries that shadow initializers (the dynamo exporter writes them).

    ONNX Runtime's quantizers transpose Gemm weights; a stale shape hint for the old layout then fails
    shape inference ("Inferred shape and existing shape differ"). Only hints go: nodes, tags and
    metadata are untouched, and the input model is never modified.
    """

    name = "drop_initializer_shape_hints"
    in_place = False

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        import onnx

        inits = {t.name for t in model.graph.initializer}
        keep = [vi for vi in model.graph.value_info if vi.name not in inits]
        dropped = len(model.graph.value_info) - len(keep)
        if not dropped:
            return PassResult(model, False, {"dropped": 0})
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        del copy.graph.value_info[:]
        copy.graph.value_info.extend(keep)
        return PassResult(copy, True, {"dropped": dropped})


@dataclass(frozen=True)
class PlainMatMul:
    """``com.microsoft.FusedMatMul`` on a constant weight back to ``MatMul`` (the weight transposed once).

    ONNX Runtime's graph optimizer (``-O2``) turns ``MatMul(x, Transpose(W))`` into ``FusedMatMul`` with
    ``transB`` (a tied LM head, for one), and its quantizers only quantize ``MatMul``: such a layer, the
    largest of a decoder, would stay float. Node names and tags are kept.
    """

    name = "plain_matmul"
    in_place = False

    def _candidates(self, model: onnx.ModelProto) -> list[int]:
        """Indexes of FusedMatMul nodes that are a plain product with an in-file constant weight (a weight
        left on disk for a model over 2 GB is not read here: that layer stays float)."""
        from onnx import TensorProto, helper

        inits = {t.name: t for t in model.graph.initializer}
        plain = {"transA": 0, "transBatchA": 0, "transBatchB": 0, "alpha": 1.0}
        found = []
        for k, node in enumerate(model.graph.node):
            weight = inits.get(node.input[1]) if node.op_type == "FusedMatMul" else None
            if weight is None or weight.data_location == TensorProto.EXTERNAL or len(weight.dims) != 2:
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if all(attrs.get(key, default) == default for key, default in plain.items()):
                found.append(k)
        return found

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        import onnx
        from onnx import helper, numpy_helper

        found = self._candidates(model)
        if not found:
            return PassResult(model, False, {"unfused": 0})
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        inits = {t.name: t for t in copy.graph.initializer}
        for k in found:
            node = copy.graph.node[k]
            name = node.input[1]
            if any(a.name == "transB" and a.i for a in node.attribute):
                weight, name = inits[name], f"{name}_transposed"
                if name not in inits:
                    inits[name] = numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), name)
                    copy.graph.initializer.append(inits[name])
            matmul = helper.make_node("MatMul", [node.input[0], name], list(node.output), name=node.name)
            matmul.metadata_props.extend(node.metadata_props)
            node.CopyFrom(matmul)
        return PassResult(copy, True, {"unfused": len(found)})


@dataclass(frozen=True)
class GemmToMatMul:
    """``Gemm`` on a constant 2-D weight (``alpha = 1``, ``transA = 0``) -> ``MatMul`` (+ ``Add`` of its bias):
    weight-only quantizers only see ``MatMul``, and GPT-2's ``Conv1D`` layers export as ``Gemm``.

    The ``MatMul`` keeps the ``Gemm``'s name and tag; ``transB`` weights are transposed once; a bias becomes an
    ``Add`` tagged as the ``Gemm`` was (a ``beta`` other than 1 scales it first). The input is not changed.
    """

    name = "gemm_to_matmul"
    in_place = False

    def _plain(self, node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
        from onnx import TensorProto, helper

        weight = inits.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if weight is None or len(weight.dims) != 2 or weight.data_location == TensorProto.EXTERNAL:
            return False
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return attrs.get("alpha", 1.0) == 1.0 and attrs.get("transA", 0) == 0

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        import onnx
        from onnx import helper, numpy_helper

        inits = {t.name: t for t in model.graph.initializer}
        found = [k for k, node in enumerate(model.graph.node) if self._plain(node, inits)]
        if not found:
            return PassResult(model, False, {"rewritten": 0})
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        inits = {t.name: t for t in copy.graph.initializer}
        replaced: dict[int, list[onnx.NodeProto]] = {}
        for k in found:
            node = copy.graph.node[k]
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            weight = node.input[1]
            if attrs.get("transB", 0):
                weight = f"{weight}_transposed"
                if weight not in inits:
                    inits[weight] = numpy_helper.from_array(
                        numpy_helper.to_array(inits[node.input[1]]).T.copy(), weight
                    )
                    copy.graph.initializer.append(inits[weight])
            has_bias = len(node.input) > 2 and node.input[2]
            product = f"{node.output[0]}_product" if has_bias else node.output[0]
            matmul = helper.make_node("MatMul", [node.input[0], weight], [product], name=node.name)
            new = [matmul]
            if has_bias:
                bias = node.input[2]
                beta = float(attrs.get("beta", 1.0))
                if beta != 1.0 and bias in inits:
                    bias = f"{bias}_beta"
                    scaled = numpy_helper.to_array(inits[node.input[2]]) * beta
                    copy.graph.initializer.append(numpy_helper.from_array(scaled.astype(scaled.dtype), bias))
                elif beta != 1.0:
                    continue  # a computed bias scaled by beta: left as a Gemm
                new.append(
                    helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}_bias")
                )
            for part in new:
                part.metadata_props.extend(node.metadata_props)
            replaced[k] = new
        nodes = [new for k, node in enumerate(copy.graph.node) for new in replaced.get(k, [node])]
        del copy.graph.node[:]
        copy.graph.node.extend(nodes)
        return PassResult(copy, bool(replaced), {"rewritten": len(replaced)})
