"""Weight-only quantization to ONNX Runtime's ``MatMulNBits`` (int4 / int8 weights, float activations) that keeps
hierarchy tags, metadata and the sidecar: the format small LLMs are deployed in on CPUs.

The weights are quantized by ONNX Runtime's own ``onnxruntime.quantization.matmul_nbits_quantizer`` (the tool
onnxruntime-genai's model builder and Olive use), one algorithm of ``WEIGHT_ALGORITHMS`` each: ``rtn`` (round to
nearest, ONNX Runtime's C++ kernels; int4 or int8, symmetric or not, embeddings too), ``hqq`` (Half-Quadratic
Quantization: zero points optimized per block without data) and ``gptq`` (GPTQ on calibration text, through the
quantizer's Intel Neural Compressor path). The flow is a chain of passes, the quantizing one re-tagged from its
input (:class:`~.retag.Retagged`): stale shape hints dropped, ``FusedMatMul`` and ``Gemm`` -> ``MatMul``
(:mod:`.prepare`), projections that read one input joined (:class:`~.projections.FuseProjections`), then
:class:`WeightOnlyQuantize` on the chosen nodes and the metadata carried (:class:`~.carry.CarryMetadata`).

Which weights: every ``MatMul`` with a constant 2-D float weight of at least ``MIN_WEIGHT_DIM`` rows and columns
(a rotary embedding's frequency product or a two-label head stays float), less those under
``--exclude-modules``; the LM head (the MatMul whose product reaches the ``logits`` output) unless
``quantize_lm_head`` is off; the token embedding tables (``Gather`` on a 2-D float table) only with
``quantize_embeddings``. With ``mixed_precision`` ``norm_inputs`` (``auto`` for a model that does not generate
text) the MatMuls that read a normalization's output stay int8 (round to nearest): those inputs carry the
outlier channels that make int4 rounding costly (all-MiniLM-L6-v2: sentence-embedding cosine 0.965 with int4
everywhere, 0.99 so).
"""

from __future__ import annotations

import contextlib
import io
import logging
import types
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..data import load_dataset
from ..errors import ConfigError, DatasetError, ModelExportError, OptimizationError
from ..hierarchy.passes import PassResult, run_passes
from ..hierarchy.tags import node_tag
from ..inference.feeds import SampleSet
from ..inference.pipelines.base import PIPELINES
from ..inference.pipelines.generation import position_ids
from ..inference.processors.text import load_tokenizer
from ..metadata.schema import CACHE_INPUT_PREFIX, KEY_QUANTIZATION, KEY_TASK
from ..metadata.tasks import normalize_task
from .calibration import find_model_dir
from .carry import CarryMetadata, model_metadata
from .config import WEIGHT_ALGORITHMS, WeightOnlyConfig, register_weight_algorithm
from .modules import excluded_nodes
from .prepare import DropShapeHints, GemmToMatMul, PlainMatMul
from .projections import FuseProjections
from .retag import Retagged

if TYPE_CHECKING:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import WeightOnlyQuantConfig

__all__ = [
    "HEAD_OUTPUTS",
    "MIN_WEIGHT_DIM",
    "WEIGHT_ONLY_OPS",
    "WeightOnlyQuantize",
    "WeightSelection",
    "calibration_samples",
    "decoder_calibration_feeds",
    "generates",
    "quantize_weights_proto",
    "select_weights",
]

log = logging.getLogger(__name__)
#: Weights with fewer rows or columns than this stay float: they are not a layer's weights (rotary
#: frequencies: 1 row) or too small for blocks to pay (a classifier's 2-3 label columns).
MIN_WEIGHT_DIM = 16
#: Graph outputs an LM head writes.
HEAD_OUTPUTS = ("logits",)
#: Ops that may stand between an LM head's product and ``logits`` (a bias, soft-capping, a last-position cut).
_HEAD_PASS_THROUGH = {
    "Add",
    "Mul",
    "Div",
    "Tanh",
    "Cast",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Slice",
    "Identity",
}
#: Normalization ops (fused or ONNX's own); a tag whose last module's class ends in one of ``_NORM_CLASSES``
#: marks the last node of an unfused one (``LlamaRMSNorm``, ``T5LayerNorm``).
_NORM_OPS = {
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
}
_NORM_CLASSES = ("Norm", "LayerNorm", "RMSNorm")
#: The ops weight-only quantization writes.
WEIGHT_ONLY_OPS = {"MatMulNBits", "GatherBlockQuantized"}
_NBITS_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"


@contextlib.contextmanager
def _nbits_quiet() -> Iterator[types.ModuleType]:
    """ONNX Runtime's ``matmul_nbits_quantizer`` module, imported without its ``logging.basicConfig(INFO)``
    taking over the root logger, with its per-node INFO lines and the GPTQ progress bar kept off stdout, and
    its numeric warnings (a zero block's scale, torch on a read-only array) off stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer

    root.handlers[:] = handlers
    root.setLevel(level)
    quantizer_log = logging.getLogger(_NBITS_LOGGER)
    old = quantizer_log.level
    quantizer_log.setLevel(logging.WARNING)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            warnings.simplefilter("ignore", UserWarning)
            yield matmul_nbits_quantizer
    finally:
        quantizer_log.setLevel(old)
        log.debug("matmul_nbits_quantizer printed:\n%s", printed.getvalue())


# ------------------------------------------------------------------------------------------- which weights
def _weights(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
    return {
        t.name: t
        for t in model.graph.initializer
        if len(t.dims) == 2 and t.data_type in floats and t.data_location != TensorProto.EXTERNAL
    }


def _weight_matmuls(model: onnx.ModelProto) -> list[str]:
    weights = _weights(model)
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul"
        and n.name
        and n.input[1] in weights
        and min(weights[n.input[1]].dims) >= MIN_WEIGHT_DIM
    ]


def _head_matmuls(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """The MatMuls of ``names`` whose product reaches a ``HEAD_OUTPUTS`` output through pass-through ops only."""
    heads = {o.name for o in model.graph.output if o.name in HEAD_OUTPUTS}
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = []
    for node in model.graph.node:
        if node.name not in names:
            continue
        frontier, seen = [node.output[0]], set()
        while frontier:
            tensor = frontier.pop()
            if tensor in heads:
                found.append(node.name)
                break
            seen.add(tensor)
            frontier += [
                out
                for user in consumers.get(tensor, [])
                if user.op_type in _HEAD_PASS_THROUGH
                for out in user.output[:1]
                if out not in seen
            ]
    return found


def _embedding_gathers(model: onnx.ModelProto) -> list[str]:
    weights = _weights(model)
    return [n.name for n in model.graph.node if n.op_type == "Gather" and n.name and n.input[0] in weights]


def _is_norm(node: onnx.NodeProto) -> bool:
    if node.op_type in _NORM_OPS:
        return True
    tag = node_tag(node) or ""
    last = tag.rsplit("/", 1)[-1].split(".", 1)[0]
    return last.endswith(_NORM_CLASSES)


#: Ops between a normalization and the projection that reads it that change no value (GPT-2's Conv1D views).
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity"}


def _norm_inputs(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """The MatMuls of ``names`` whose input a normalization writes, through views (the projections that read the
    residual stream: attention q/k/v, MLP up/gate)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    wanted = set(names)
    found = []
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        source = producer.get(node.input[0])
        while source is not None and source.op_type in _VIEWS:
            source = producer.get(source.input[0])
        if source is not None and _is_norm(source):
            found.append(node.name)
    return found


def generates(model: onnx.ModelProto) -> bool:
    """Whether the model's task (embedded metadata) runs a pipeline that generates tokens."""
    task = model_metadata(model).get(KEY_TASK)
    pipe = PIPELINES.find(normalize_task(str(task))) if task else None
    return bool(pipe is not None and pipe.generates)


@dataclass(frozen=True)
class WeightSelection:
    """The nodes a weight-only run quantizes, at which width, and the candidates it leaves float (and why)."""

    matmuls: tuple[str, ...]  # at the config's width
    int8: tuple[str, ...]  # int4 runs: kept at int8 by mixed precision
    embeddings: tuple[str, ...]
    lm_head: tuple[str, ...]  # the LM head's MatMuls (quantized or not, as the config says)
    excluded: tuple[str, ...]  # candidates under --exclude-modules
    mixed_precision: str = "none"  # what ``auto`` resolved to

    @property
    def nodes(self) -> list[str]:
        return [*self.matmuls, *self.embeddings]

    def record(self) -> dict[str, Any]:
        return {
            "matmuls": len(self.matmuls) + len(self.int8),
            "int8_matmuls": len(self.int8),
            "embeddings": len(self.embeddings),
            "lm_head": list(self.lm_head),
            "excluded_nodes": len(self.excluded),
            "mixed_precision_applied": self.mixed_precision,
        }


def select_weights(model: onnx.ModelProto, cfg: WeightOnlyConfig) -> WeightSelection:
    """Which MatMuls (and Gathers) ``cfg`` quantizes in ``model``, and at which width; ``--exclude-modules``
    globs resolved on tags."""
    excluded = set(excluded_nodes(model, cfg.exclude_modules))
    candidates = _weight_matmuls(model)
    heads = _head_matmuls(model, candidates)
    chosen = [n for n in candidates if n not in excluded and (cfg.quantize_lm_head or n not in heads)]
    gathers = [n for n in _embedding_gathers(model) if n not in excluded] if cfg.quantize_embeddings else []
    skipped = tuple(n for n in [*candidates, *_embedding_gathers(model)] if n in excluded)
    mixed = cfg.mixed_precision
    if mixed == "auto":
        mixed = "none" if cfg.bits == 8 or generates(model) else "norm_inputs"
    int8 = _norm_inputs(model, chosen) if mixed == "norm_inputs" else []
    body = tuple(n for n in chosen if n not in int8)
    return WeightSelection(body, tuple(int8), tuple(gathers), tuple(heads), skipped, mixed)


# ------------------------------------------------------------------------------------------- algorithms
def _run_quantizer(
    model: onnx.ModelProto,
    cfg: WeightOnlyConfig,
    nodes: list[str],
    algo_config: WeightOnlyQuantConfig,
    nbits: types.ModuleType,
) -> onnx.ModelProto:
    """ONNX Runtime's ``MatMulNBitsQuantizer`` on a copy of ``model``, every MatMul / Gather not in ``nodes``
    excluded (it would otherwise take every one of its op types)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the quantizer rewrites the graph it is given
    wanted = set(nodes)
    others = [n.name for n in copy.graph.node if n.op_type in ("MatMul", "Gather") and n.name not in wanted]
    quantizer = nbits.MatMulNBitsQuantizer(
        copy,
        bits=cfg.bits,
        block_size=cfg.block_size,
        is_symmetric=bool(cfg.symmetric),
        accuracy_level=cfg.accuracy_level or None,
        nodes_to_exclude=others,
        algo_config=algo_config,
    )
    quantizer.process()
    return quantizer.model.model


@register_weight_algorithm(
    "rtn",
    bits=(4, 8),
    symmetric=(True, False),
    embeddings=True,
    summary="round to nearest per block (ONNX Runtime's C++ kernels; what onnxruntime-genai's builder uses)",
)
def _rtn(
    model: onnx.ModelProto, cfg: WeightOnlyConfig, nodes: list[str], samples: SampleSet | None
) -> onnx.ModelProto:
    with _nbits_quiet() as nbits:
        ops = ("MatMul", "Gather") if cfg.quantize_embeddings else ("MatMul",)
        algo = nbits.DefaultWeightOnlyQuantConfig(
            block_size=cfg.block_size,
            is_symmetric=bool(cfg.symmetric),
            accuracy_level=cfg.accuracy_level or None,
            op_types_to_quantize=ops,
            bits=cfg.bits,
        )
        return _run_quantizer(model, cfg, nodes, algo, nbits)


@register_weight_algorithm(
    "hqq",
    bits=(4,),
    symmetric=(False,),
    summary="Half-Quadratic Quantization: scales and float zero points optimized per block, no data",
)
def _hqq(
    model: onnx.ModelProto, cfg: WeightOnlyConfig, nodes: list[str], samples: SampleSet | None
) -> onnx.ModelProto:
    with _nbits_quiet() as nbits:
        algo = nbits.HQQWeightOnlyQuantConfig(block_size=cfg.block_size, bits=cfg.bits)
        return _run_quantizer(model, cfg, nodes, algo, nbits)


class _CalibrationFeeds:
    """The feeds of a :class:`SampleSet` as ONNX Runtime's calibration reader (GPTQ copies and iterates it)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = feeds
        self.index = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.index >= len(self.feeds):
            return None
        self.index += 1
        return self.feeds[self.index - 1]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.feeds)

    def rewind(self) -> None:
        self.index = 0


@register_weight_algorithm(
    "gptq",
    bits=(4,),
    symmetric=(True, False),
    calibrated=True,
    summary="GPTQ: each layer's rounding corrected with its inputs' Hessian on calibration text",
)
def _gptq(
    model: onnx.ModelProto, cfg: WeightOnlyConfig, nodes: list[str], samples: SampleSet | None
) -> onnx.ModelProto:
    if samples is None or not len(samples):
        raise ConfigError(
            "gptq calibrates on data and got none",
            hint="pass --calibration-data TEXTS.csv (or use --algorithm rtn)",
        )
    feeds = decoder_calibration_feeds(model, samples.feeds)
    with _nbits_quiet() as nbits:
        algo = nbits.GPTQWeightOnlyQuantConfig(calibration_data_reader=_CalibrationFeeds(feeds))
        return _run_quantizer(model, cfg, nodes, algo, nbits)


def calibration_samples(source: str | Path, onnx_path: Path, cfg: WeightOnlyConfig) -> SampleSet:
    """Calibration texts for a calibrated algorithm: read by the one dataset reader, ``calibration_samples`` of
    them (seeded draw), each its own feed through the model's tokenizer (the graph's other inputs, a decoder's
    positions and empty cache, are added by :func:`decoder_calibration_feeds`)."""
    path = Path(source)
    if not path.exists():
        raise DatasetError(
            f"calibration data not found: {path}", hint="check the path given to --calibration-data"
        )
    dataset = load_dataset(path, require_labels=False)
    if dataset.kind != "text" or not dataset.texts:
        raise ConfigError(
            f"{cfg.algorithm} calibrates on text; {path} holds {dataset.kind} data",
            hint="pass a CSV/TSV/JSON(L) file with a column of texts",
        )
    chosen = dataset.sample(cfg.calibration_samples, cfg.seed)
    tokenizer = load_tokenizer(find_model_dir(onnx_path, cfg.tokenizer))
    feeds = []
    for text in chosen.texts or []:
        encoding = tokenizer([text], return_tensors="np")
        feeds.append(
            {k: np.asarray(v).astype(np.int64) for k, v in encoding.items() if isinstance(v, np.ndarray)}
        )
    return SampleSet(feeds, None, "text")


def decoder_calibration_feeds(
    model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """``feeds`` (a tokenizer's ids and mask) completed for a graph that takes more: a decoder with a key/value
    cache gets its first step (``position_ids`` from the mask, every ``past_key_values.*`` empty); any other
    missing input is an error naming it. Inputs the graph does not take are dropped."""
    inputs = {i.name: i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}}
    out = []
    for feed in feeds:
        batch = len(next(iter(feed.values())))
        full = {k: v for k, v in feed.items() if k in inputs}
        if "position_ids" in inputs and "position_ids" not in full and "attention_mask" in feed:
            full["position_ids"] = position_ids(feed["attention_mask"].astype(np.int64))
        for name, spec in inputs.items():
            if name in full:
                continue
            if not name.startswith(CACHE_INPUT_PREFIX):
                raise ConfigError(
                    f"calibration feeds for this graph need {name!r}, which text does not give",
                    hint="calibrate a decoder or encoder graph on text; an encoder-decoder's decoders cannot be",
                )
            full[name] = _empty_past(spec, batch)
        out.append(full)
    return out


def _empty_past(spec: onnx.ValueInfoProto, batch: int) -> np.ndarray:
    from onnx import helper

    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in spec.type.tensor_type.shape.dim]
    if len(dims) != 4 or not dims[1] or not dims[3]:
        raise ConfigError(f"cache input {spec.name!r} has no fixed heads and head size: {dims}")
    dtype = helper.tensor_dtype_to_np_dtype(spec.type.tensor_type.elem_type)
    return np.zeros((batch, dims[1], 0, dims[3]), dtype)


# ------------------------------------------------------------------------------------------------ the pass
def _set_accuracy_level(model: onnx.ModelProto, level: int) -> None:
    """``accuracy_level`` on every ``MatMulNBits`` (HQQ writes none): the type its activations compute in."""
    from onnx import helper

    if not level:
        return
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(helper.make_attribute("accuracy_level", level))


@dataclass(frozen=True)
class WeightOnlyQuantize:
    """The algorithm of ``config`` on the nodes ``nodes`` (MatMuls, and Gathers for embeddings), after
    round-to-nearest int8 on ``int8_nodes``; wrap in :class:`~.retag.Retagged` (ONNX Runtime's quantizer writes
    new nodes without tags)."""

    config: WeightOnlyConfig
    nodes: tuple[str, ...]
    samples: SampleSet | None = None
    int8_nodes: tuple[str, ...] = ()
    in_place = False

    @property
    def name(self) -> str:
        return f"quantize_weights_{self.config.weights}_{self.config.algorithm}"

    def _quantize(self, model: onnx.ModelProto) -> onnx.ModelProto:
        if self.int8_nodes:  # the int8 part first: the second run only sees the MatMuls left
            int8 = self.config.with_changes(
                weights="int8",
                algorithm="rtn",
                mixed_precision="none",
                quantize_embeddings=False,
                calibration_data=None,
            )
            model = _rtn(model, int8, list(self.int8_nodes), None)
        if not self.nodes:
            return model
        return WEIGHT_ALGORITHMS[self.config.algorithm].fn(model, self.config, list(self.nodes), self.samples)

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        if not (self.nodes or self.int8_nodes):
            return PassResult(model, False, {"written": {}})
        try:
            out = self._quantize(model)
        except ModelExportError:
            raise
        except Exception as exc:  # noqa: BLE001 - ORT's quantizer raises bare exceptions; wrapped with the algorithm
            raise OptimizationError(
                f"{self.config.algorithm} weight-only quantization failed: {type(exc).__name__}: {exc}"
            ) from exc
        _set_accuracy_level(out, self.config.accuracy_level)
        written = Counter(n.op_type for n in out.graph.node if n.op_type in WEIGHT_ONLY_OPS)
        return PassResult(out, True, {"written": dict(written)})


def quantize_weights_proto(
    model: onnx.ModelProto, cfg: WeightOnlyConfig, samples: SampleSet | None = None
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Weight-only quantize a tagged ModelProto (weights in memory); returns (tagged model, facts about the run)."""
    work, steps = run_passes(model, [DropShapeHints(), PlainMatMul(), GemmToMatMul()])
    selection = select_weights(work, cfg)
    if cfg.fuse_projections:
        joinable = frozenset((*selection.matmuls, *selection.int8))  # siblings share one input: one width
        work, more = run_passes(work, [FuseProjections(joinable)])
        steps += more
        selection = select_weights(work, cfg)
    record = {**cfg.record(), **selection.record()}
    if samples is not None and cfg.calibrated:
        record["calibration_samples"], record["calibration_kind"] = len(samples), samples.kind
    quantized, more = run_passes(
        work,
        [
            Retagged(WeightOnlyQuantize(cfg, tuple(selection.nodes), samples, selection.int8)),
            CarryMetadata(model, KEY_QUANTIZATION, record),
        ],
    )
    steps += more
    notes = _notes(selection, cfg)
    retagged = more[0].record.get("retag", {"total_nodes": 0, "by_rule": {}})
    if retagged["total_nodes"] and not retagged["by_rule"]:
        notes.append(
            "the input has no hierarchy tags, so neither has the output; export it with modelexport first"
        )
    facts = {
        "notes": notes,
        "exclude": list(selection.excluded),
        "retag": retagged,
        "metadata_keys": more[-1].record["metadata_keys"],
        "record": record,
        "passes": steps,
    }
    return quantized, facts


def _notes(selection: WeightSelection, cfg: WeightOnlyConfig) -> list[str]:
    notes = []
    if not (selection.matmuls or selection.int8):
        notes.append("no MatMul with a constant 2-D weight to quantize: the model is unchanged")
    if selection.int8:
        notes.append(
            f"mixed precision ({selection.mixed_precision}): {len(selection.int8)} MatMuls that read a "
            "normalization's output kept at int8"
        )
    if selection.lm_head and not cfg.quantize_lm_head:
        notes.append(f"LM head kept float (--no-quantize-lm-head): {', '.join(selection.lm_head)}")
    return notes
