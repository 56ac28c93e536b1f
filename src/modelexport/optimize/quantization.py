"""int8 quantization with ONNX Runtime that keeps hierarchy tags, metadata and the sidecar.

The flow is a chain of passes (``hierarchy.passes``), each re-tagged from its input so coverage stays
100%: :class:`Preprocess` (``quant_pre_process``) -> :class:`DropShapeHints` -> :class:`QuantizeMode`
(module exclusion from tags, a mode of ``QUANT_MODES``: ``quantize_dynamic`` or ``quantize_static`` in
QDQ format, excluded nodes fed float again) -> :class:`~.carry.CarryMetadata`. The sidecar is carried
over and the output written atomically.

Weights the input stores as external data stay on disk: each pass hands ONNX Runtime's tools a file
whose data is copied chunk by chunk (``save_onnx(data_dir=)``), and their outputs keep external data too,
so a model over protobuf's 2 GB limit is never serialized as one protobuf.

A multi-graph package folder (encoder-decoder) is quantized graph by graph into a new package folder
(:mod:`.package`), dynamic mode only.

Weight-only quantization (a :class:`~.config.WeightOnlyConfig`: ``quantize --weights int4|int8``) takes the
same entry point, output rule, sidecar and metadata carry-over and package transform; its passes are in
:mod:`.weight_only`, and its model is always written with its weights in ``<name>.data`` beside it (ONNX
Runtime then maps them instead of parsing one protobuf: a faster start and less memory).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import onnx_weight_bytes
from ..errors import ConfigError, ModelExportError, OptimizationError, first_line
from ..hierarchy.graph import drop_dead_nodes
from ..hierarchy.passes import Pass, PassResult, PassStep, run_passes
from ..hierarchy.tags import node_tag
from ..inference.feeds import SampleSet
from ..onnxfile import (
    EXTERNAL_DATA_THRESHOLD,
    external_tensors,
    load_external_tensors,
    load_onnx,
    load_structure,
    model_bytes,
    needs_external_data,
    package_components,
    resolve_model_path,
    save_onnx,
    staged_output,
)
from .calibration import calibration_reader, load_samples
from .carry import CarryMetadata, transform_plan, write_transformed
from .config import (
    CALIBRATE_METHODS,
    QUANT_MODES,
    WEIGHT_TYPES,
    QuantizeConfig,
    WeightOnlyConfig,
    check_samples,
)
from .evaluate import compare_models, module_error_report
from .modules import excluded_nodes, package_exclusions
from .package import PackageResult, is_multi_graph, transform_package
from .prepare import DropShapeHints, PlainMatMul
from .retag import Retagged, tag_coverage
from .source import check_sources
from .weight_only import WEIGHT_ONLY_OPS, calibration_samples, quantize_weights_proto

if TYPE_CHECKING:
    import onnx

__all__ = [
    "QUANT_OPS",
    "DropShapeHints",
    "Preprocess",
    "QuantizeMode",
    "QuantizeResult",
    "quantize",
    "quantize_proto",
    "excluded_nodes",
    "restore_float_inputs",
    "standard_attention_nodes",
    "quantized_per_module",
]

log = logging.getLogger(__name__)
RECORD_KEY = "modelexport.quantization"
#: Op types that run in integer arithmetic (dynamic and operator-oriented formats).
QUANT_OPS = {
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeMatMul",
    "QAttention",
    "QGemm",
    "QLinearMatMul",
    "QLinearConv",
    "QLinearAdd",
    "QLinearMul",
    "DynamicQuantizeLSTM",
    "QEmbedLayerNormalization",
}
#: Nodes a quantizer inserts (they carry scale/zero-point plumbing, not model compute).
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def _external(model: Path) -> bool:
    """Whether the file at ``model`` keeps weights as external data: then ORT's quantizers must too (their
    output may pass protobuf's 2 GB limit)."""
    return bool(external_tensors(load_structure(model)))


def _qtype(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    return getattr(QuantType, WEIGHT_TYPES[name])


@QUANT_MODES.register("dynamic")
def _dynamic(
    model: Path, out: Path, cfg: QuantizeConfig, exclude: list[str], samples: SampleSet | None
) -> None:
    """Weights int8 offline, activations quantized at run time (no calibration)."""
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(
        model,
        out,
        op_types_to_quantize=list(cfg.op_types) or None,
        per_channel=cfg.per_channel,
        reduce_range=cfg.reduce_range,
        weight_type=_qtype(cfg.weight_type),
        nodes_to_exclude=exclude or None,
        use_external_data_format=_external(model),
    )


@QUANT_MODES.register("static")
def _static(
    model: Path, out: Path, cfg: QuantizeConfig, exclude: list[str], samples: SampleSet | None
) -> None:
    """Weights and activations int8 (QDQ format), ranges calibrated on real samples."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    if samples is None or not len(samples):
        raise ConfigError(
            "static quantization needs calibration data",
            hint="pass --calibration-data PATH (text CSV/JSON, image folder or .npz)",
        )
    method = getattr(CalibrationMethod, CALIBRATE_METHODS[cfg.calibrate_method])
    reader, extra_options = calibration_reader(samples, cfg.progress)
    printed = io.StringIO()  # ORT's calibrators print once per feed; stdout is for results (--format json)
    with contextlib.redirect_stdout(printed):
        quantize_static(
            model,
            out,
            reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(cfg.op_types) or None,
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
            activation_type=_qtype(cfg.activation_type),
            weight_type=_qtype(cfg.weight_type),
            nodes_to_exclude=exclude or None,
            calibrate_method=method,
            extra_options=extra_options,
            use_external_data_format=_external(model),
        )
    log.debug("quantize_static printed:\n%s", printed.getvalue())


@contextlib.contextmanager
def _cwd(path: str) -> Iterator[None]:
    """ORT's symbolic shape inference leaves temp files in the current directory when it fails."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@dataclass(frozen=True)
class Preprocess:
    """``quant_pre_process`` (shape inference + ORT basic optimization); wrap in :class:`Retagged`.

    Symbolic shape inference fails on many dynamo graphs; then it is retried without it and the
    fallback is noted. A failure of both leaves the model as it was (noted, never silent).
    """

    #: Where the input's external-data references resolve (weights left on disk by ``quantize``).
    data_dir: Path | None = None
    name = "quant_pre_process"
    in_place = False

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        from onnxruntime.quantization import quant_pre_process

        notes: list[str] = []
        large = {"save_as_external_data": True} if needs_external_data(model) else {}
        attempts: tuple[dict[str, Any], ...] = ({}, {"skip_symbolic_shape": True})
        if onnx_weight_bytes(model) > EXTERNAL_DATA_THRESHOLD:  # it serializes the model whole: over 2 GB
            attempts = attempts[1:]  # it cannot, and its copies cost gigabytes of memory
            notes.append(
                "quant_pre_process without symbolic shape inference (weights over the protobuf limit)"
            )
        with tempfile.TemporaryDirectory(prefix="modelexport-pre-") as tmp, _cwd(tmp):
            src, out = save_onnx(model, Path(tmp) / "in.onnx", data_dir=self.data_dir), Path(tmp) / "pre.onnx"
            for kwargs in attempts:
                try:
                    quant_pre_process(str(src), str(out), **kwargs, **large)
                except Exception as exc:  # noqa: BLE001 - recorded, next attempt tried
                    what = "without symbolic shape inference" if kwargs else "with symbolic shape inference"
                    reason = first_line(exc, 100)
                    notes.append(f"quant_pre_process {what} failed ({reason})")
                    continue
                return PassResult(load_onnx(out), True, {"notes": notes})
        return PassResult(model, False, {"notes": notes})


def standard_attention_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of ONNX's own ``Attention`` nodes (what ``-O2`` makes of a cached attention): ORT's integer
    quantizer takes any ``Attention`` for ``com.microsoft.Attention`` by op type and writes an invalid
    ``QAttention`` for it. The op has no weights, so it stays float (excluded) and loses nothing."""
    return [n.name for n in model.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]


def restore_float_inputs(model: onnx.ModelProto, names: list[str], original: onnx.ModelProto) -> int:
    """Feed excluded nodes float tensors again; returns the number of inputs rewired.

    ORT's QDQ quantizer rewires *every* consumer of a quantized tensor to the DequantizeLinear
    output, excluded nodes included (activations, and initializers shared with quantized nodes), so
    they would compute on int8-rounded values. This pass points them back at the float activation,
    or at the float initializer copied from ``original``, and drops Q/DQ nodes nobody reads.
    """
    by_output = {o: n for n in model.graph.node for o in n.output}
    originals = {i.name: i for i in original.graph.initializer}
    present = {i.name for i in model.graph.initializer}
    float_of: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        q = by_output.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            float_of[node.output[0]] = q.input[0]
        elif (base := node.output[0].removesuffix("_DequantizeLinear_Output")) in originals:
            float_of[node.output[0]] = base
    wanted, rewired = set(names), 0
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        for i, name in enumerate(node.input):
            if name in float_of:
                node.input[i] = float_of[name]
                rewired += 1
                if node.input[i] in originals and node.input[i] not in present:
                    model.graph.initializer.append(originals[node.input[i]])
                    present.add(node.input[i])
    drop_dead_nodes(model, {"QuantizeLinear", "DequantizeLinear"})
    return rewired


def _module_of(tag: str, depth: int) -> str:
    return "/" + "/".join(tag[1:].split("/")[:depth]) if tag else "(untagged)"


def quantized_per_module(model: onnx.ModelProto, depth: int = 3) -> dict[str, int]:
    """Nodes that run quantized, per module (tag cut at ``depth`` segments).

    A node counts when its op is an integer op or a weight-only one (``MatMulNBits``, ``GatherBlockQuantized``),
    or (QDQ format) when a DequantizeLinear feeds it.
    """
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    counts: Counter[str] = Counter()
    for n in model.graph.node:
        if (
            n.op_type in QUANT_OPS
            or n.op_type in WEIGHT_ONLY_OPS
            or (n.op_type not in QDQ_OPS and any(i in dq_out for i in n.input))
        ):
            tag = node_tag(n) or ""
            counts[_module_of(tag, depth)] += 1
    return dict(sorted(counts.items()))


@dataclass
class QuantizeResult:
    """What ``quantize`` wrote and what changed."""

    input_path: Path | None
    output_path: Path | None
    config: QuantizeConfig | WeightOnlyConfig
    size_before: int
    size_after: int
    nodes_before: int
    nodes_after: int
    excluded_nodes: list[str]
    quantized_per_module: dict[str, int]
    coverage: dict[str, Any]
    retag: dict[str, Any]
    metadata_keys: list[str]
    sidecar_path: Path | None = None
    calibration: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    error_report: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    passes: list[PassStep] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def size_ratio(self) -> float:
        return round(self.size_before / self.size_after, 3) if self.size_after else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": str(self.input_path) if self.input_path else None,
            "output": str(self.output_path) if self.output_path else None,
            "settings": self.config.record(),
            "size_before": self.size_before,
            "size_after": self.size_after,
            "size_ratio": self.size_ratio,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "excluded_nodes": len(self.excluded_nodes),
            "quantized_per_module": self.quantized_per_module,
            "coverage": self.coverage,
            "retag": self.retag,
            "metadata_keys": self.metadata_keys,
            "sidecar": str(self.sidecar_path) if self.sidecar_path else None,
            "calibration": self.calibration,
            "evaluation": self.evaluation,
            "error_report": self.error_report,
            "notes": self.notes,
            "passes": [p.to_dict() for p in self.passes],
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class QuantizeMode:
    """A mode of ``QUANT_MODES`` on a tagged model; the nodes in ``exclude`` stay float.

    ORT's quantizers drop node metadata: wrap in :class:`Retagged`.
    """

    config: QuantizeConfig
    exclude: tuple[str, ...] = ()
    samples: SampleSet | None = None
    #: Where the input's external-data references resolve (weights left on disk by ``quantize``).
    data_dir: Path | None = None
    in_place = False

    @property
    def name(self) -> str:
        return f"quantize_{self.config.mode}"

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        mode, exclude = self.config.mode, list(self.exclude)
        with tempfile.TemporaryDirectory(prefix="modelexport-q-") as tmp:
            src = save_onnx(model, Path(tmp) / "in.onnx", data_dir=self.data_dir)
            out = Path(tmp) / "quantized.onnx"
            try:
                QUANT_MODES[mode](src, out, self.config, exclude, self.samples)
            except ModelExportError:
                raise
            except Exception as exc:  # noqa: BLE001 - ORT raises bare Exceptions; wrap with the mode
                raise OptimizationError(f"{mode} quantization failed: {type(exc).__name__}: {exc}") from exc
            quantized = load_onnx(out)
        rewired = restore_float_inputs(quantized, exclude, model) if exclude else 0
        load_external_tensors(quantized, self.data_dir)  # float weights restored from a model left on disk
        return PassResult(quantized, True, {"excluded_nodes": len(exclude), "rewired_inputs": rewired})


def quantize_proto(
    model: onnx.ModelProto,
    cfg: QuantizeConfig,
    samples: SampleSet | None = None,
    data_dir: Path | None = None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Quantize a tagged ModelProto; returns (tagged quantized model, facts about the run).

    Passes: [re-tagged ``quant_pre_process``], shape-hint cleanup, ``FusedMatMul`` -> ``MatMul``, then the
    re-tagged mode (with ``--exclude-modules`` resolved on the pre-processed graph) and the metadata
    carry-over. ``data_dir``:
    where ``model``'s external-data references resolve (``load_onnx(..., external_data=False)``); ORT's
    tools then read those weights from files, never from one serialized protobuf.
    """
    prep: list[Pass] = [Retagged(Preprocess(data_dir))] if cfg.preprocess else []
    work, steps = run_passes(model, [*prep, DropShapeHints(), PlainMatMul()])
    exclude = excluded_nodes(work, cfg.exclude_modules)
    record = {**cfg.record(), "excluded_nodes": len(exclude)}
    if samples is not None and cfg.mode == "static":
        record["calibration_samples"] = len(samples)
        record["calibration_kind"] = samples.kind
    quantized, more = run_passes(
        work,
        [
            Retagged(QuantizeMode(cfg, (*exclude, *standard_attention_nodes(work)), samples, data_dir)),
            CarryMetadata(model, RECORD_KEY, record),
        ],
    )
    steps += more
    notes = [n for step in steps for n in step.record.get("notes", [])]
    retagged = more[0].record["retag"]
    if retagged["total_nodes"] and not retagged["by_rule"]:
        notes.append(
            "the input has no hierarchy tags, so neither has the output; export it with modelexport first"
        )
    facts = {
        "notes": notes,
        "exclude": exclude,
        "retag": retagged,
        "metadata_keys": more[-1].record["metadata_keys"],
        "record": record,
        "passes": steps,
    }
    return quantized, facts


def quantize(
    model_path: str | Path,
    output_path: str | Path,
    config: QuantizeConfig | WeightOnlyConfig | None = None,
    *,
    samples: SampleSet | None = None,
    eval_data: str | Path | None = None,
    eval_samples: int = 200,
    error_report: bool = False,
    overwrite: bool = False,
    **options: object,
) -> QuantizeResult | PackageResult:
    """Quantize ``model_path`` to ``output_path``; tags, metadata and sidecar are carried over.

    ``output_path`` follows the one output rule (:mod:`modelexport.onnxfile.output`): ``FILE.onnx``, or a
    folder (``model.onnx`` and the package files inside); an existing file is replaced only with
    ``overwrite``, and only when an earlier run of ours wrote it. ``options`` are fields of ``config``'s class
    (:class:`QuantizeConfig`; :class:`WeightOnlyConfig` for weight-only int4/int8). Static mode and calibrated
    weight-only algorithms (gptq) calibrate on ``samples`` or on ``config.calibration_data``. ``eval_data`` adds
    fp32-vs-int8 agreement/accuracy and latency; ``error_report`` adds per-module output errors on the
    calibration (or eval) samples. A multi-graph package folder is quantized graph by graph into the folder
    ``output_path`` (:mod:`.package`).
    """
    cfg = (config or QuantizeConfig()).with_changes(**options) if options else (config or QuantizeConfig())
    check_samples("eval_samples", eval_samples)
    if isinstance(cfg, WeightOnlyConfig) and cfg.calibrated and samples is None and not cfg.calibration_data:
        raise ConfigError(
            f"algorithm {cfg.algorithm} calibrates on data and got none",
            hint="pass --calibration-data TEXTS.csv (a column of texts), or use --algorithm rtn or hqq",
        )
    if is_multi_graph(model_path):
        uses_data = samples is not None or bool(cfg.calibration_data or eval_data or error_report)
        return _quantize_package(model_path, output_path, cfg, uses_data, overwrite)
    src = resolve_model_path(model_path)
    inputs = (model_path, cfg.calibration_data, eval_data)
    plan = transform_plan(src, output_path, inputs=inputs, overwrite=overwrite)
    check_sources([src])  # after the output's refusal (which reads no input), before any work
    with staged_output(plan) as stage:
        result = _quantize_file(
            src, stage.path / plan.name, cfg, samples, eval_data, eval_samples, error_report, plan.package
        )
    result.output_path = plan.path
    result.sidecar_path = plan.folder / result.sidecar_path.name if result.sidecar_path else None
    return result


def _quantize_file(
    src: Path,
    dst: Path,
    cfg: QuantizeConfig | WeightOnlyConfig,
    samples: SampleSet | None = None,
    eval_data: str | Path | None = None,
    eval_samples: int = 200,
    error_report: bool = False,
    package: tuple[str, ...] = (),
) -> QuantizeResult:
    """Quantize the graph file ``src`` into ``dst`` (in a staging folder), with ``package`` files copied."""
    start = time.perf_counter()
    model = load_onnx(src, external_data=False)  # weights stored as external data stay on disk (> 2 GB)
    if samples is None and cfg.calibration_data and isinstance(cfg, WeightOnlyConfig):
        samples = calibration_samples(cfg.calibration_data, src, cfg)
    elif samples is None and cfg.calibration_data:
        samples = load_samples(
            cfg.calibration_data, model, src, cfg.calibration_samples, tokenizer=cfg.tokenizer, seed=cfg.seed
        )
    # evaluation data is read and checked against the model before any quantizing (a bad file costs no run)
    evals = (
        load_samples(eval_data, model, src, eval_samples, tokenizer=cfg.tokenizer, seed=cfg.seed + 1)
        if eval_data is not None
        else None
    )
    if error_report and samples is None and evals is None:
        raise ConfigError(
            "--error-report needs samples to run", hint="pass --calibration-data or --eval-data"
        )
    if isinstance(cfg, WeightOnlyConfig):
        load_external_tensors(model, src.parent)  # the quantizer reads every weight it rewrites
        quantized, facts = quantize_weights_proto(model, cfg, samples)
    else:
        quantized, facts = quantize_proto(model, cfg, samples, src.parent)
    result = QuantizeResult(
        src,
        dst,
        cfg,
        model_bytes(src),
        0,
        len(model.graph.node),
        len(quantized.graph.node),
        facts["exclude"],
        quantized_per_module(quantized),
        tag_coverage(quantized),
        facts["retag"],
        facts["metadata_keys"],
        None,
        notes=facts["notes"],
        passes=facts["passes"],
    )
    if samples is not None:
        method = cfg.algorithm if isinstance(cfg, WeightOnlyConfig) else cfg.calibrate_method
        result.calibration = {"kind": samples.kind, "samples": len(samples), "method": method}
    if eval_data is not None or error_report:  # the evaluations run the fp32 model from memory
        load_external_tensors(model, src.parent)
    _evaluate(result, model, quantized, samples, evals, error_report)
    result.sidecar_path, copied = write_transformed(
        quantized,
        src,
        dst,
        {"kind": "quantize", **facts["record"]},
        package,
        external_data=isinstance(cfg, WeightOnlyConfig),
    )
    result.size_after = model_bytes(dst)
    if copied:
        result.notes.append(f"copied the package files the model needs beside it: {', '.join(copied)}")
    result.seconds = time.perf_counter() - start
    return result


def _quantize_package(
    folder: str | Path,
    output_dir: str | Path,
    cfg: QuantizeConfig | WeightOnlyConfig,
    uses_data: bool,
    overwrite: bool,
) -> PackageResult:
    """Every graph of a multi-graph package, dynamic int8 or weight-only, into a new package folder."""
    names = ", ".join(p.name for p in package_components(folder).values())
    if isinstance(cfg, WeightOnlyConfig) and cfg.calibrated:
        raise ConfigError(
            f"{folder} is a package of graphs ({names}): {cfg.algorithm} calibrates each graph on its own inputs, "
            "and a decoder's (its past caches, the encoder's output) are not in a dataset",
            hint="use --algorithm rtn or hqq (no calibration), or quantize one graph file",
        )
    if isinstance(cfg, QuantizeConfig) and cfg.mode != "dynamic":
        raise ConfigError(
            f"{folder} is a package of graphs ({names}): static quantization needs calibration feeds for "
            "each graph, and a decoder's (its past caches, the encoder's output) are not in a dataset",
            hint="use --mode dynamic (no calibration), or quantize one graph file with --calibration-data",
        )
    if uses_data:
        raise ConfigError(
            f"{folder} is a package of graphs ({names}): --calibration-data, --eval-data and --error-report "
            "feed a dataset to one graph",
            hint="quantize the package without them, or pass one graph file",
        )
    check_sources(package_components(folder).values())
    exclude = package_exclusions(package_components(folder), cfg.exclude_modules)
    return transform_package(
        folder,
        output_dir,
        "quantize",
        lambda src, dst: _quantize_file(src, dst, cfg.with_changes(exclude_modules=exclude[src.name])),
        overwrite=overwrite,
    )


def _evaluate(
    result: QuantizeResult,
    model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    samples: SampleSet | None,
    evals: SampleSet | None,
    error_report: bool,
) -> None:
    if evals is not None:
        result.evaluation = compare_models(model, quantized, evals)
    if error_report:
        data = samples or evals
        assert data is not None  # refused before quantizing
        result.error_report = module_error_report(model, quantized, data)
