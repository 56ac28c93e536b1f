"""Transformer fusions with onnxscript's rewriter, the library made for dynamo-exported graphs.

``onnxscript.rewriter.ort_fusions.optimize_for_ort`` matches the patterns the dynamo exporter emits
(SDPA -> MultiHeadAttention -> Attention, GroupQueryAttention, rotary embedding, SkipLayerNorm,
RMSNorm / SkipSimplifiedLayerNorm, BiasGelu) and reports how many times each rule matched. ONNX
Runtime's ``onnxruntime.transformers.optimizer`` was written for TorchScript graphs and fuses no
attention on dynamo graphs; it runs after this only where it still adds something (see
:func:`ort_fusion_needed`).

A decoder gets no usable attention fusion from onnxscript (its GroupQueryAttention rule expects another
mask pattern and drops the mask, assuming unpadded batches). :mod:`.masked_attention` then rewrites each
layer's cache concatenation (if any), repeated key/value heads and decomposed attention into one ONNX
``Attention`` (opset 23) that takes the graph's own padding + causal mask and the past, and writes
``present.*``: exact for grouped heads and any padding, left padding included, because the mask is
applied as the graph applies it (``com.microsoft.GroupQueryAttention`` assumes each row's cache is valid
from position 0, and is slower on the CPU). :mod:`.attention_heads` then gives each ``Attention`` the
projections in their own (B, S, heads * D) layout, without the model's head split and merge.

Some rules assume more than the graph states: the GroupQueryAttention and rotary rules ignore the
attention mask and the batch of a decoder exported without a KV cache (outputs differ on a padded batch).
So every fusion is checked: the fused graph and its input run on a batch of two padded right, then left
(:func:`probe_feeds`; a KV cache gets a past, the mask spans past + new tokens). When they differ beyond
the export tolerance, the next set is tried: the fusions that cannot change attention semantics
(``SAFE_FUSIONS``: normalization and Gelu) with the masked attention, then those alone; the rejections
are reported.

onnxscript copies the metadata of one matched node onto the fused node; that tag is removed here so
the re-tagging (:class:`..retag.Retagged`) gives each fused node the deepest common ancestor of the
tags of everything it replaced, as for every other transform.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..hierarchy.graph import index_limits
from ..hierarchy.tags import TAG_KEY, TAG_SOURCE_KEY
from ..inference.pipelines.generation import position_ids
from ..metadata.schema import CACHE_INPUT_PREFIX
from ..runtime.session import create_session
from .attention_heads import HEADS_RULE, attention_on_projections
from .group_query import GQA_RULE, attention_as_gqa
from .mask_index import use_mask_index
from .masked_attention import fuse_masked_attention
from .rotary_freqs import normalize_rotary_freqs

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir
    from onnxruntime import InferenceSession

__all__ = [
    "FUSION_REPORT_KEYS",
    "SAFE_FUSIONS",
    "VERIFY_ATOL",
    "fuse_for_ort",
    "ort_fusion_needed",
    "probe_feeds",
]

#: Largest max-abs difference accepted between the fused graph and its input: the export's default atol.
VERIFY_ATOL = 1e-4
#: Probe batch: two rows, the second padded (at the end, then at the start), so mask handling and batch size\n#: both count; a KV cache gets a past of 5 positions.
PROBE_BATCH, PROBE_SEQ, PROBE_PAD, PROBE_ID_RANGE, PROBE_PAST = 2, 8, 3, 10, 5
#: Probe size of an image's dynamic ``height``/``width`` (Optimum's names, which exports use): 224, the size
#: most image models are trained at, a multiple of every usual stride and patch (4, 7, 8, 14, 16, 32). A
#: sequence's 8 would leave a deep CNN's last stages with no pixels.
PROBE_IMAGE, IMAGE_AXES = 224, frozenset({"height", "width"})

#: onnxscript's per-rule counters, grouped into the fusions a user asks about (name -> counters).
FUSION_REPORT_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "multi_head_attention": ("mha1", "mha2", "kv_cache_mha", "no_cache_mha"),
    "sdpa": ("sdpa",),
    "group_query_attention": ("gqa", "packed_qkv_for_gqa", "kv_cache_gqa", "no_cache_gqa"),
    "shared_cache_attention": (GQA_RULE,),
    "rotary_embedding": ("rotary_embedding", "partial_rotary_embedding"),
    "cos_sin_cache": ("cos_sin_cache",),
    "skip_layer_normalization": ("skip_layer_normalization",),
    "rms_normalization": ("rms_normalization",),
    "skip_rms_normalization": ("skip_rms_normalization",),
    "gelu": ("erf_gelu", "gelu"),
    "bias_gelu": ("bias_gelu",),
    "mask_index": ("mask_index",),
    "attention_3d": (HEADS_RULE,),
}
_UNTAG = {TAG_KEY, TAG_SOURCE_KEY}


def _drop_copied_tags(model: onnx.ModelProto, names_before: set[str]) -> None:
    """Remove the tag onnxscript copied onto nodes it created (their names are new)."""
    for node in model.graph.node:
        if node.name in names_before:
            continue
        kept = [p for p in node.metadata_props if p.key not in _UNTAG]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def _safe_fusions() -> dict[str, Callable[..., int]]:
    """onnxscript rules that rewrite normalization and Gelu math only: no mask, position or batch
    semantics (the rotary rules, like GQA, assume the export's batch of position ids)."""
    from onnxscript.rewriter.ort_fusions import (
        bias_gelu,
        erfgelu,
        gelu,
        rms_normalization,
        skip_normalization,
    )

    return {
        "erf_gelu": erfgelu.fuse_erfgelu,
        "rms_normalization": rms_normalization.fuse_rms_normalization,
        "skip_layer_normalization": skip_normalization.fuse_skip_layer_normalization,
        "skip_rms_normalization": skip_normalization.fuse_skip_rms_normalization,
        "gelu": gelu.fuse_gelu,
        "bias_gelu": bias_gelu.fuse_bias_gelu,
    }


#: The fusions applied when the full set changes the outputs (names of onnxscript's counters).
SAFE_FUSIONS = (
    "erf_gelu",
    "rms_normalization",
    "skip_layer_normalization",
    "skip_rms_normalization",
    "gelu",
    "bias_gelu",
)


def _all_fusions(model: ir.Model) -> dict[str, int]:
    """onnxscript's fusions for ORT, then the attention of a key/value cache as ONNX ``Attention``
    (:mod:`.masked_attention`: onnxscript matches none there, and its GroupQueryAttention drops the mask)."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    normalize_rotary_freqs(model)  # transformers 5's rotary angles, in the form the cos/sin rule matches
    counts = optimize_for_ort(model)[1]
    return {
        **counts,
        **fuse_masked_attention(model),
        **attention_on_projections(model),
        **attention_as_gqa(model),
    }


def _safe_only(model: ir.Model) -> dict[str, int]:
    from onnxscript import optimizer

    optimizer.optimize(model)
    rules = _safe_fusions()
    counts = {name: rules[name](model) for name in SAFE_FUSIONS}
    optimizer.optimize(model)
    return counts


def _safe_and_attention(model: ir.Model) -> dict[str, int]:
    """The safe fusions and each attention as ONNX ``Attention`` with the graph's own mask: for graphs
    where one of onnxscript's other rules changes the outputs (its GroupQueryAttention and rotary rules
    on a decoder exported without a cache)."""
    return {
        **_safe_only(model),
        **fuse_masked_attention(model),
        **attention_on_projections(model),
        **attention_as_gqa(model),
    }


def _dynamic_sizes(model: onnx.ModelProto, seq: int = PROBE_SEQ, past: int = PROBE_PAST) -> dict[str, int]:
    """Probe size per dynamic dim symbol: batch 2, sequence 8, a cache's past length 5, a mask over
    past + new tokens (a symbol only the mask has, in a graph with ``past*`` inputs) 8 + 5, an image's
    height and width :data:`PROBE_IMAGE`."""
    sizes: dict[str, int] = {}
    owners: dict[str, set[str]] = {}
    for inp in model.graph.input:
        for k, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.dim_param:
                owners.setdefault(d.dim_param, set()).add(inp.name)
                on_past = "past" in inp.name.lower() and k == 2
                size = PROBE_IMAGE if d.dim_param in IMAGE_AXES else past if on_past else seq
                sizes.setdefault(d.dim_param, PROBE_BATCH if k == 0 else size)
    if any("past" in i.name.lower() for i in model.graph.input):
        for inp in model.graph.input:
            dims = inp.type.tensor_type.shape.dim
            if "mask" in inp.name.lower() and len(dims) == 2 and owners.get(dims[1].dim_param) == {inp.name}:
                sizes[dims[1].dim_param] = seq + past
    return sizes


def probe_feeds(
    model: onnx.ModelProto, left: bool = False, seq: int = PROBE_SEQ, past: int = PROBE_PAST
) -> dict[str, Any]:
    """A padded batch for every graph input (sizes: :func:`_dynamic_sizes`); integer ``*mask*`` inputs are
    ones with the second row's last (``left``: first) 3 positions zero; a cached decoder's ``position_ids``
    as transformers counts them from that mask (kept tokens before, padding at 1); other integers in [0, 10) (below
    the rows of a table they index); floats standard normal."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(0)
    limits = index_limits(model)
    sizes = _dynamic_sizes(model, seq, past)
    cached = any(i.name.startswith(CACHE_INPUT_PREFIX) for i in model.graph.input)
    mask = None  # read by position_ids after it (the graph lists the mask first, as transformers does)
    feeds: dict[str, Any] = {}
    for inp in model.graph.input:
        tensor = inp.type.tensor_type
        shape = [
            d.dim_value or sizes.get(d.dim_param, PROBE_BATCH if k == 0 else seq)
            for k, d in enumerate(tensor.shape.dim)
        ]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if dtype.kind in "iub" and "mask" in inp.name.lower() and len(shape) >= 2 and shape[0] > 1:
            value = np.ones(shape, dtype)
            value[1, ..., slice(0, PROBE_PAD) if left else slice(-PROBE_PAD, None)] = 0
        elif inp.name == "position_ids" and cached and len(shape) == 2 and mask is not None:
            value = position_ids(mask)[:, -shape[1] :].astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, min(PROBE_ID_RANGE, limits.get(inp.name, PROBE_ID_RANGE)), shape)
            value = value.astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        feeds[inp.name] = value
        if dtype.kind in "iub" and "mask" in inp.name.lower() and len(shape) == 2:
            mask = value
    return feeds


def _outputs(session: InferenceSession, feeds: dict[str, Any]) -> list[Any]:
    """What the probe compares: every output; for a graph with a cache, what decoding reads of two steps
    (each graph continuing its own cache): the first output (logits) of the prompt's kept tokens, then all of
    the next token's (one new kept token per row). A fused cache may hold the same keys differently (a
    rotary cache at shifted positions, :mod:`.group_query`), so it is checked by the step that reads it."""
    import numpy as np

    names = [o.name for o in session.get_outputs()]
    outputs = session.run(None, feeds)
    pasts = [i.name for i in session.get_inputs() if i.name.startswith(CACHE_INPUT_PREFIX)]
    presents = [n for n in names[1:] if n.startswith("present")]
    mask = next((v for k, v in feeds.items() if "mask" in k.lower() and np.ndim(v) == 2), None)
    if not pasts or len(pasts) != len(presents) or mask is None or "input_ids" not in feeds:
        return outputs
    new = feeds["input_ids"].shape[1]
    kept = mask[:, -new:].astype(bool)
    step = {**feeds, "input_ids": feeds["input_ids"][:, -1:]}
    grown = np.concatenate([mask, np.ones_like(mask[:, :1])], axis=1)
    step[next(k for k in feeds if feeds[k] is mask)] = grown
    if "position_ids" in step:
        step["position_ids"] = position_ids(grown)[:, -1:].astype(feeds["position_ids"].dtype)
    step.update(zip(pasts, (outputs[names.index(n)] for n in presents), strict=True))
    return [outputs[0][kept], session.run(None, step)[0]]


def _max_diff(reference: list[Any], model: onnx.ModelProto, feeds: dict[str, Any]) -> float:
    """Largest |difference| of ``model``'s probe outputs (:func:`_outputs`) from ``reference`` (inf when it
    fails to run)."""
    import numpy as np

    try:
        outputs = _outputs(create_session(model, log_severity_level=4)[0], feeds)
    except Exception:  # noqa: BLE001 - a fused graph ORT rejects is a failed fusion, reported as such
        return math.inf
    return max(
        (
            float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
            for a, b in zip(reference, outputs, strict=True)
            if np.asarray(a).size
        ),
        default=0.0,
    )


def _fused(
    model: onnx.ModelProto, apply: Callable[[ir.Model], dict[str, int]]
) -> tuple[onnx.ModelProto, dict[str, int]]:
    import onnx
    import onnx_ir as ir

    source = onnx.ModelProto()
    source.CopyFrom(model)  # onnx_ir shares parts of the proto it reads, and some rules edit them in place
    ir_model = ir.from_proto(source)
    counts = apply(ir_model)
    out = ir.to_proto(ir_model)
    _drop_copied_tags(out, {n.name for n in model.graph.node})
    return out, {k: int(v) for k, v in counts.items() if v}


def _matched(rules: dict[str, int]) -> dict[str, int]:
    return {
        name: total
        for name, keys in FUSION_REPORT_KEYS.items()
        if (total := sum(rules.get(k, 0) for k in keys))
    }


def _probe_steps(model: onnx.ModelProto) -> tuple[tuple[int, int], ...]:
    """(new tokens, past length) of each probe. A graph with a cache is checked on what decoding runs: a
    prompt on an empty cache, then (:func:`_outputs`) one token on the cache it wrote; not several new tokens
    onto a past (ONNX Runtime's ``GroupQueryAttention`` takes those for a batch of one only)."""
    if _feeds_its_cache_back(model):
        return ((PROBE_SEQ, 0),)
    return ((PROBE_SEQ, PROBE_PAST),)


def _feeds_its_cache_back(model: onnx.ModelProto) -> bool:
    """A decoder of token ids whose every cache input has its ``present`` output (not an encoder-decoder's
    step, whose cross-attention cache comes from the first step, nor one fed embeddings)."""
    names = {i.name for i in model.graph.input}
    pasts = [n for n in names if n.startswith(CACHE_INPUT_PREFIX)]
    presents = [o for o in model.graph.output if o.name.startswith("present")]
    return bool(pasts) and len(pasts) == len(presents) and "input_ids" in names


def fuse_for_ort(model: onnx.ModelProto, atol: float = VERIFY_ATOL) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``model`` fused by onnxscript (input untouched), checked against ``model`` on :func:`probe_feeds`.

    Stats: ``matched`` (fusion -> patterns matched, non-zero only), ``rules`` (onnxscript's counters),
    ``max_abs_diff`` on the probe, and ``rejected`` (why the full set was not used) when it fell back.
    """
    probes = [  # encoders pad right, decoders left; a cached decoder's prompt, then one token on a past
        probe_feeds(model, left, seq, past) for seq, past in _probe_steps(model) for left in (False, True)
    ]
    stats: dict[str, Any] = {"tool": "onnxscript.rewriter.ort_fusions"}
    try:
        session = create_session(model, log_severity_level=4)[0]
        references = [_outputs(session, feeds) for feeds in probes]
    except Exception as exc:  # noqa: BLE001 - inputs the probe cannot build (a shape the graph constrains)
        reason = f"the unfused model does not run on generated probe inputs ({type(exc).__name__}); fusion unchecked"
        return model, {**stats, "fusions": "none", "matched": {}, "rules": {}, "rejected": {"probe": reason}}
    for name, apply in (("all", _all_fusions), ("safe+attention", _safe_and_attention), ("safe", _safe_only)):
        out, rules = _fused(model, apply)
        if name == "all":  # the padding mask as ORT's mask_index: no 4-D bias built per run
            out, rules["mask_index"] = use_mask_index(out)
            rules = {k: v for k, v in rules.items() if v}
        diff = max(_max_diff(ref, out, feeds) for ref, feeds in zip(references, probes, strict=True))
        if diff <= atol:
            return out, {
                **stats,
                "fusions": name,
                "matched": _matched(rules),
                "rules": rules,
                "max_abs_diff": diff,
            }
        stats.setdefault("rejected", {})[name] = (
            f"{', '.join(_matched(rules)) or 'no fusion'}: outputs differ by {diff:.3g} > {atol} "
            f"on a batch of {PROBE_BATCH} padded right and left"
        )
    return model, {**stats, "fusions": "none", "matched": {}, "rules": {}}


def ort_fusion_needed(onnxscript_stats: dict[str, Any], approximate_gelu: bool) -> bool:
    """Whether ORT's transformer optimizer adds something after onnxscript's fusions.

    On dynamo graphs it finds nothing more (measured on BERT, MiniLM, ViT); it still converts
    Gelu/BiasGelu to FastGelu (``approximate_gelu``), and fuses graphs onnxscript matched nothing in
    (TorchScript exports).
    """
    return approximate_gelu or not onnxscript_stats.get("matched")
