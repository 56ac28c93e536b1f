"""Rotary frequencies in the form onnxscript's cos/sin-cache rule matches, whichever transformers wrote them.

transformers 4 computes a rotary embedding's angles as ``inv_freq[None, :, None] @ position_ids[:, None, :]``
transposed; transformers 5 as ``position_ids[..., None].float() * inv_freq`` (a broadcast ``Mul``). Both are
one product per element, so the values are identical, but ``onnxscript.rewriter.ort_fusions``' cos/sin-cache
rule (which turns the angles into the cached ``cos``/``sin`` tables ORT's ``RotaryEmbedding`` takes) matches
only the first: without it the rotary fusion it started is undone and every layer keeps its decomposed
rotation. This pass rewrites the second form into the first, where its angles feed ``Concat(freqs, freqs)``
(the rotary embedding's duplicated angles), before onnxscript's fusions run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnxscript.rewriter import MatchContext, RewriterContext
    from onnxscript.rewriter._pattern_ir import ValuePattern
    from onnxscript.rewriter.pattern import OpsetPatternBuilder

__all__ = ["normalize_rotary_freqs"]


def _target(
    op: OpsetPatternBuilder, position_ids: ValuePattern, axes: ValuePattern, inv_freq: ValuePattern
) -> ValuePattern:
    positions = op.Cast(op.Unsqueeze(position_ids, axes), _allow_other_attributes=True)
    return op.Mul(positions, inv_freq)


def _condition(
    context: MatchContext, position_ids: ir.Value, axes: ir.Value, inv_freq: ir.Value, **_: object
) -> bool:
    from onnxscript.rewriter import _ir_utils

    freqs = context.root.outputs[0] if hasattr(context, "root") else None
    if inv_freq.const_value is None or len(inv_freq.const_value.shape) != 1:
        return False
    if position_ids.shape is None or len(position_ids.shape) != 2:
        return False
    if not (_ir_utils.is_1d_value(axes, [-1]) or _ir_utils.is_1d_value(axes, [2])):
        return False
    uses = list(freqs.uses()) if freqs is not None else []
    return bool(uses) and all(
        use.node.op_type == "Concat" and len({id(v) for v in use.node.inputs}) == 1 for use in uses
    )


def _replacement(op: RewriterContext, position_ids: ir.Value, axes: ir.Value, inv_freq: ir.Value) -> ir.Value:
    import onnx_ir as ir

    column = inv_freq.const_value.numpy().reshape(1, -1, 1)  # [1, E, 1], as transformers 4 expands it
    positions = op.Cast(op.Unsqueeze(position_ids, op.Constant(value_ints=[1])), to=ir.DataType.FLOAT)
    freqs = op.MatMul(op.Constant(value=ir.tensor(column)), positions)  # [B, E, S]
    return op.Transpose(freqs, perm=[0, 2, 1])  # [B, S, E]


def normalize_rotary_freqs(model: ir.Model) -> int:
    """Rewrite (in place) transformers 5's broadcast rotary angles into transformers 4's ``MatMul`` form;
    returns how many were rewritten."""
    from onnxscript.rewriter import pattern

    rule = pattern.RewriteRule(_target, _replacement, _condition, name="RotaryFreqsAsMatMul")
    return int(pattern.RewriteRuleSet([rule], commute=True).apply_to_model(model))
