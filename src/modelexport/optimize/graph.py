"""Graph optimization that keeps hierarchy tags: ORT offline levels, transformer fusion, fp16, simplify.

Every entry of ``GRAPH_PASSES`` takes a tagged ModelProto and returns a new one plus statistics;
:class:`GraphPass` makes one a pass (``hierarchy.passes``) bound to a config. ONNX Runtime's offline
optimizer and its transformer fusions drop node ``metadata_props`` (and the fp16 converter and
onnxslim insert or rebuild nodes), so each runs inside :class:`Retagged`: the new graph is matched
against the previous one by node names and tensor edges, fused nodes get the deepest common
ancestor of the tags of the nodes they replaced, coverage stays 100%.

A multi-graph package folder (encoder-decoder) is optimized graph by graph into a new package folder
(:mod:`.package`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._registry import Registry
from ..errors import OptimizationError
from ..hierarchy.passes import Pass, PassResult, PassStep, run_passes
from ..onnxfile import load_onnx, package_components, resolve_model_path, save_onnx, staged_output
from ..runtime.session import create_session
from .carry import CarryMetadata, model_metadata, transform_plan, write_transformed
from .config import OptimizeConfig
from .fusion import fuse_for_ort, ort_fusion_needed
from .package import PackageResult, is_multi_graph, transform_package
from .retag import Retagged, tag_coverage
from .skip_norm import kept_for, split_skip_layer_norms
from .source import check_sources

if TYPE_CHECKING:
    import onnx

__all__ = [
    "GRAPH_PASSES",
    "GraphPass",
    "OptimizeResult",
    "graph_passes",
    "register_pass",
    "optimize_model",
    "optimize_proto",
    "optimize_with_record",
    "op_changes",
    "hf_dims",
]

log = logging.getLogger(__name__)
RECORD_KEY = "modelexport.optimization"

PassFn = Callable[[Any, OptimizeConfig, Path], "tuple[Any, dict[str, Any]]"]
#: name -> (applies to this config?, pass). Run in registration order.
GRAPH_PASSES: Registry[tuple[Callable[[OptimizeConfig], bool], PassFn]] = Registry("graph pass")


def register_pass(name: str, applies: Callable[[OptimizeConfig], bool]) -> Callable[[PassFn], PassFn]:
    """Add the pass ``fn`` to ``GRAPH_PASSES``; ``applies(config)`` says whether a config asks for it."""
    return GRAPH_PASSES.register_as(name, lambda fn: (applies, fn))


def _hf_config(model: onnx.ModelProto) -> dict[str, Any]:
    """The Hugging Face config embedded in the metadata ({} when absent)."""
    config = model_metadata(model).get("hf_model_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = None
    return config if isinstance(config, dict) else {}


def hf_dims(model: onnx.ModelProto) -> tuple[int, int]:
    """(num_heads, hidden_size) from the Hugging Face config embedded in the metadata; 0 for a size that is
    absent or given per stage (a list: ORT's optimizer then reads it off the graph)."""
    config = _hf_config(model)
    heads = config.get("num_attention_heads") or config.get("n_head") or 0
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model") or 0
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) else 0 for v in (heads, hidden))


def fusion_model_types(model: onnx.ModelProto, requested: str | None) -> list[str]:
    """ORT fusion families to try, in order: the one asked for; else the embedded config's ``model_type``
    when ORT knows it (its own ``optimizer.MODEL_TYPES``), then ORT's generic encoder fusions ("bert")."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    if requested:  # checked against MODEL_TYPES by OptimizeConfig
        return [requested]
    embedded = _hf_config(model).get("model_type")
    return [embedded, "bert"] if embedded in MODEL_TYPES and embedded != "bert" else ["bert"]


def ort_transformer_optimizer(
    model: onnx.ModelProto, cfg: OptimizeConfig, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Attention / LayerNorm / GELU fusions of ``onnxruntime.transformers.optimizer`` (TorchScript graphs;
    on any graph: Gelu -> FastGelu)."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    heads, hidden = hf_dims(model)
    heads, hidden = cfg.num_heads or heads, cfg.hidden_size or hidden
    src = save_onnx(model, tmp / "tf_in.onnx")
    candidates = fusion_model_types(model, cfg.model_type)
    failed: dict[str, str] = {}
    for model_type in candidates:
        options = FusionOptions(model_type)
        options.enable_gelu_approximation = cfg.approximate_gelu
        try:
            opt = optimizer.optimize_model(
                str(src),
                model_type=model_type,
                num_heads=heads,
                hidden_size=hidden,
                optimization_options=options,
                opt_level=0,
            )
        except Exception as exc:  # noqa: BLE001 - recorded; the next family is tried, the last one re-raised
            failed[model_type] = f"{type(exc).__name__}: {exc}"[:200]
            if model_type == candidates[-1]:
                raise
            continue
        fused = {k: v for k, v in (opt.get_fused_operator_statistics() or {}).items() if v}
        stats = {"model_type": model_type, "num_heads": heads, "hidden_size": hidden, "fused": fused}
        if cfg.approximate_gelu:
            stats["approximate_gelu"] = True
        return opt.model, {**stats, "failed_model_types": failed} if failed else stats
    raise AssertionError("unreachable: the loop returns or re-raises")  # pragma: no cover


@register_pass("transformer_fusion", lambda c: c.transformer_fusion)
def transformer_fusion(
    model: onnx.ModelProto, cfg: OptimizeConfig, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Transformer fusions before ORT's level: onnxscript's rewriter (engine auto/onnxscript), then ORT's
    transformer optimizer where it adds something (engine ort, approximate Gelu, nothing matched)."""
    stats: dict[str, Any] = {"engine": cfg.fusion_engine}
    if cfg.fusion_engine != "ort":
        model, stats["onnxscript"] = fuse_for_ort(model)
        stats["matched"] = stats["onnxscript"]["matched"]
    run_ort = cfg.fusion_engine == "ort" or cfg.approximate_gelu
    if cfg.fusion_engine == "auto":
        run_ort = ort_fusion_needed(stats["onnxscript"], cfg.approximate_gelu)
    if run_ort:
        model, stats["ort"] = ort_transformer_optimizer(model, cfg, tmp)
        stats["fused"] = stats["ort"]["fused"]
    if not cfg.skip_norm_fusion:  # ORT's CPU SkipLayerNormalization is slower than Add + LayerNormalization
        # a decoder's one-token steps keep the RMS form (faster there)
        result = split_skip_layer_norms(model, kept_for(model))
        model = result.model
        if result.split or result.kept:
            stats["skip_layer_norm"] = {"split_for_cpu": result.split, "kept": result.kept}
    return model, stats


@register_pass("ort", lambda c: c.level != "disable")
def ort_offline(
    model: onnx.ModelProto, cfg: OptimizeConfig, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """ONNX Runtime's graph optimizer at ``cfg.level``, saved to a file (``optimized_model_filepath``)."""
    src, out = save_onnx(model, tmp / "ort_in.onnx"), tmp / "ort_out.onnx"
    create_session(
        src,
        graph_optimization_level=cfg.level,
        optimized_model_filepath=str(out),
        disabled_optimizers=() if cfg.skip_norm_fusion else None,  # None: the CPU session's default
    )
    stats = {"level": cfg.level}
    if cfg.level == "all":
        stats["note"] = (
            "level 'all' may add layout changes specific to this CPU; prefer 'extended' for portable files"
        )
    return load_onnx(out), stats


@register_pass("fp16", lambda c: c.fp16)
def to_fp16(model: onnx.ModelProto, cfg: OptimizeConfig, tmp: Path) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """float16 weights and compute, float32 inputs/outputs kept (Cast nodes at the edges)."""
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    stats: dict[str, Any] = {"keep_io_types": True}
    if ort.get_device() == "CPU":
        stats["warning"] = "float16 runs slower than float32 on CPU; use it for GPU deployment"
        log.warning(stats["warning"])
    return convert_float_to_float16(model, keep_io_types=True), stats


@register_pass("simplify", lambda c: c.simplify)
def simplify(
    model: onnx.ModelProto, cfg: OptimizeConfig, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """onnxslim: constant folding, dead-code and redundant-op removal."""
    try:
        import onnxslim
    except ImportError as exc:
        raise OptimizationError(
            "--simplify needs onnxslim", hint="pip install 'modelexport[optimize]'"
        ) from exc
    return onnxslim.slim(model), {"tool": f"onnxslim {getattr(onnxslim, '__version__', '')}".strip()}


@dataclass(frozen=True)
class GraphPass:
    """The entry ``name`` of ``GRAPH_PASSES`` run with ``config``; its input is left untouched."""

    name: str
    config: OptimizeConfig
    in_place = False

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        fn = GRAPH_PASSES[self.name][1]
        with tempfile.TemporaryDirectory(prefix="modelexport-opt-") as tmp:
            new, stats = fn(model, self.config, Path(tmp))
        return PassResult(new, True, {"stats": stats})


def graph_passes(cfg: OptimizeConfig) -> list[Pass]:
    """The passes ``cfg`` asks for, in registration order, each re-tagged from its input."""
    return [Retagged(GraphPass(name, cfg)) for name, (applies, _) in GRAPH_PASSES.items() if applies(cfg)]


@dataclass
class OptimizeResult:
    input_path: Path | None
    output_path: Path | None
    config: OptimizeConfig
    passes: list[PassStep]
    op_changes: dict[str, int]
    coverage: dict[str, Any]
    size_before: int = 0
    size_after: int = 0
    sidecar_path: Path | None = None
    metadata_keys: list[str] = field(default_factory=list)
    #: Package files (config, processor) copied beside the output because it is in another folder.
    copied_files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": str(self.input_path) if self.input_path else None,
            "output": str(self.output_path) if self.output_path else None,
            "settings": self.config.record(),
            "passes": [p.to_dict() for p in self.passes],
            "op_changes": self.op_changes,
            "coverage": self.coverage,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "sidecar": str(self.sidecar_path) if self.sidecar_path else None,
            "copied_files": self.copied_files,
            "metadata_keys": self.metadata_keys,
        }


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def optimize_proto(model: onnx.ModelProto, cfg: OptimizeConfig) -> tuple[onnx.ModelProto, list[PassStep]]:
    """Run the applicable passes in order, re-tagging after each; the input proto is not changed."""
    return run_passes(model, graph_passes(cfg), wrap=lambda msg: OptimizationError(f"graph {msg}"))


def optimize_with_record(
    model: onnx.ModelProto, cfg: OptimizeConfig
) -> tuple[onnx.ModelProto, list[PassStep], list[str]]:
    """:func:`optimize_proto`, then ``model``'s metadata carried over with the ``modelexport.optimization``
    record: (optimized model, pass records, metadata keys). Used by ``optimize`` and ``export --optimize``."""
    optimized, records = optimize_proto(model, cfg)
    carry = CarryMetadata(model, RECORD_KEY, {**cfg.record(), "passes": [r.name for r in records]})
    return optimized, records, carry(optimized).record["metadata_keys"]


def op_changes(before: onnx.ModelProto, after: onnx.ModelProto) -> dict[str, int]:
    """op type -> count after minus count before, for the op types whose count changed."""
    a, b = _ops(before), _ops(after)
    return {op: b[op] - a[op] for op in sorted(set(a) | set(b)) if a[op] != b[op]}


def _optimize_file(
    src: Path, dst: Path, cfg: OptimizeConfig, package: tuple[str, ...] = ()
) -> OptimizeResult:
    """Optimize the graph file ``src`` into ``dst`` (in a staging folder), with ``package`` files copied."""
    model = load_onnx(src)
    optimized, records, keys = optimize_with_record(model, cfg)
    sidecar, copied = write_transformed(optimized, src, dst, {"kind": "optimize", **cfg.record()}, package)
    return OptimizeResult(
        src,
        dst,
        cfg,
        records,
        op_changes(model, optimized),
        tag_coverage(optimized),
        src.stat().st_size,
        dst.stat().st_size,
        sidecar,
        keys,
        copied,
    )


def optimize_model(
    model_path: str | Path,
    output_path: str | Path,
    config: OptimizeConfig | None = None,
    *,
    overwrite: bool = False,
    **options: object,
) -> OptimizeResult | PackageResult:
    """Optimize ``model_path`` into ``output_path`` (atomic); tags, metadata and sidecar carried over.

    ``output_path`` follows the one output rule (:mod:`modelexport.onnxfile.output`): ``FILE.onnx``, or a
    folder (``model.onnx`` and the package files inside); an existing file is replaced only with
    ``overwrite``, and only when an earlier run of ours wrote it. ``options`` are :class:`OptimizeConfig`
    fields. A multi-graph package folder is optimized graph by graph into the folder ``output_path``
    (:mod:`.package`).
    """
    cfg = (config or OptimizeConfig()).with_changes(**options)
    if is_multi_graph(model_path):
        check_sources(package_components(model_path).values())
        return transform_package(
            model_path, output_path, "optimize", lambda s, d: _optimize_file(s, d, cfg), overwrite=overwrite
        )
    src = resolve_model_path(model_path)
    plan = transform_plan(src, output_path, inputs=(model_path,), overwrite=overwrite)
    check_sources([src])  # after the output's refusal (which reads no input), before any work
    with staged_output(plan) as stage:
        result = _optimize_file(src, stage.path / plan.name, cfg, plan.package)
    result.output_path = plan.path
    result.sidecar_path = plan.folder / result.sidecar_path.name if result.sidecar_path else None
    return result
