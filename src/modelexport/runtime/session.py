"""One session factory for every part of modelexport.

Providers are an ordered preference list; CPU is always appended last so a session can always be
made. Unavailable providers are skipped with one warning naming what is available, and every
attempt is recorded so callers can report what ran where.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._config import split_names, unknown_choice
from ..errors import ConfigError, OnnxFileError, ProviderError, first_line
from ..onnxfile import load_onnx, resolve_model_path

if TYPE_CHECKING:
    import onnx
    import onnxruntime

__all__ = [
    "GRAPH_LEVELS",
    "GRAPH_LEVEL_ALIASES",
    "CPU_DISABLED_OPTIMIZERS",
    "SessionConfig",
    "graph_level",
    "SessionInfo",
    "available_providers",
    "create_session",
    "resolve_providers",
    "check_providers",
    "load_reason",
    "set_log_severity",
    "warn_unavailable",
    "fallback_said_once",
]

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
#: Short names users type on the command line (``--ep cuda,cpu``).
PROVIDER_ALIASES: dict[str, str] = {
    "cpu": CPU,
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
}
#: ONNX Runtime's graph optimization levels: our name -> ``ort.GraphOptimizationLevel`` member.
GRAPH_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
#: Other spellings accepted on input (``modelexport optimize --level none`` was documented).
GRAPH_LEVEL_ALIASES = {"none": "disable"}
#: ONNX Runtime graph transformers left out of a session that runs on the CPU provider alone (the default,
#: ``SessionConfig.disabled_optimizers=None``). ``SkipLayerNormFusion`` turns ``Add`` + ``LayerNormalization``
#: into ``SkipLayerNormalization``, whose CPU kernel runs 2.5-6x slower than the two ops it replaces
#: (``benchmarks/kernel_choice.py``); on GPU providers the fused kernel is the fast one, so it stays.
CPU_DISABLED_OPTIMIZERS: tuple[str, ...] = ("SkipLayerNormFusion",)


#: The log severity of sessions whose config sets none: 3 (errors); the CLI sets 4 unless --debug, since every
#: failure also comes back as an exception it reports in one line.
_LOG_SEVERITY = {"default": 3}


def set_log_severity(level: int) -> None:
    """ONNX Runtime's log severity for every later session (0 verbose .. 4 fatal), its own tools' sessions
    (quantization, shape inference) included."""
    import onnxruntime as ort

    _LOG_SEVERITY["default"] = level
    ort.set_default_logger_severity(level)


def graph_level(name: str, option: str = "graph_optimization_level") -> str:
    """The canonical name of a graph optimization level (aliases resolved); ConfigError otherwise."""
    key = str(name).lower()
    key = GRAPH_LEVEL_ALIASES.get(key, key)
    if key not in GRAPH_LEVELS:
        valid = ", ".join([*GRAPH_LEVELS, *GRAPH_LEVEL_ALIASES])
        raise ConfigError(f"{option} must be one of {valid}, got {name!r}")
    return key


def available_providers() -> list[str]:
    """Providers this onnxruntime build can use."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _canonical(name: str) -> str:
    key = name.strip()
    if key.lower() in PROVIDER_ALIASES:
        return PROVIDER_ALIASES[key.lower()]
    if key.endswith("ExecutionProvider") and key in _all_providers():
        return key  # one ONNX Runtime knows, whether or not this build has it (the fallback skips those)
    raise ConfigError(
        unknown_choice("execution provider", name, sorted(PROVIDER_ALIASES), {"gpu": "cuda"}),
        hint="use a name from the list, or a full name onnxruntime.get_all_providers() lists (CUDAExecutionProvider)",
    )


def _all_providers() -> set[str]:
    """Every provider name ONNX Runtime knows (available in this build or not)."""
    import onnxruntime as ort

    return set(ort.get_all_providers())


def check_providers(requested: list[str] | str | None) -> tuple[str, ...]:
    """The canonical names of ``requested`` (``"cuda,cpu"``); an unknown name is a ConfigError naming the
    closest valid one. Nothing is loaded: commands check ``--ep`` with this before any work."""
    return tuple(_canonical(p) for p in split_names(requested))


#: Inside :func:`fallback_said_once`: the missing-provider sets already said (None: every session says it).
_WARNED: set[tuple[str, ...]] | None = None


@contextlib.contextmanager
def fallback_said_once(said: list[str] | None = None) -> Iterator[None]:
    """Within the block, a run that builds many sessions (a pipeline and its policy search) says each set of
    missing providers once; ``said``: a set the caller has already told the user about itself."""
    global _WARNED
    previous, _WARNED = _WARNED, {tuple(said)} if said else set()
    try:
        yield
    finally:
        _WARNED = previous


def warn_unavailable(skipped: list[str], order: list[str]) -> None:
    """The warning for requested providers this machine lacks: what is missing and what runs instead (once
    per set inside :func:`fallback_said_once`)."""
    key = tuple(skipped)
    if not skipped or (_WARNED is not None and key in _WARNED):
        return
    if _WARNED is not None:
        _WARNED.add(key)
    log.warning(
        "execution providers not available here: %s; falling back to %s (available: %s)",
        ", ".join(skipped),
        ", ".join(order),
        ", ".join(available_providers()),
    )


def resolve_providers(
    requested: list[str] | str | None, available: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """Return (providers to try in order, requested-but-unavailable). CPU always comes last."""
    if isinstance(requested, str):
        requested = list(split_names(requested))
    wanted = [_canonical(p) for p in (requested or [])]
    available = available if available is not None else available_providers()
    order: list[str] = []
    skipped: list[str] = []
    for p in wanted:
        if p == CPU or p in order:
            continue
        (order if p in available else skipped).append(p)
    order.append(CPU)
    return order, skipped


@dataclass(frozen=True)
class SessionConfig:
    """How to build an InferenceSession."""

    providers: tuple[str, ...] = ()
    graph_optimization_level: str = "all"
    optimized_model_filepath: str | None = None
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    enable_profiling: bool = False
    profile_file_prefix: str | None = None
    #: ONNX Runtime's log severity (0 verbose .. 4 fatal); None: the process default, :func:`set_log_severity`.
    log_severity_level: int | None = None
    provider_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Where a ModelProto's external-data references resolve (``load_onnx(..., external_data=False)``):
    #: ONNX Runtime reads those weights from disk, so they are never serialized with the graph.
    external_data_dir: str | None = None
    #: Further ONNX Runtime session config entries (``SessionOptions.add_session_config_entry``).
    config_entries: dict[str, str] = field(default_factory=dict)
    #: ONNX Runtime graph transformers to leave out (``InferenceSession(disabled_optimizers=...)``);
    #: None: ``CPU_DISABLED_OPTIMIZERS`` when the session runs on the CPU provider alone, else none.
    disabled_optimizers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.providers, str):
            object.__setattr__(self, "providers", split_names(self.providers))
        else:
            object.__setattr__(self, "providers", tuple(self.providers or ()))
        object.__setattr__(self, "graph_optimization_level", graph_level(self.graph_optimization_level))
        if self.disabled_optimizers is not None:
            object.__setattr__(self, "disabled_optimizers", tuple(split_names(self.disabled_optimizers)))
        if self.intra_op_num_threads < 0 or self.inter_op_num_threads < 0:
            raise ConfigError("thread counts must be >= 0 (0 lets ONNX Runtime choose)")


@dataclass
class SessionInfo:
    """What was asked for and what actually runs."""

    requested: list[str]
    tried: list[str]
    skipped_unavailable: list[str]
    errors: dict[str, str]
    active: list[str]

    @property
    def provider(self) -> str:
        """The provider that actually runs the model (the first one the session kept)."""
        return self.active[0] if self.active else CPU

    @property
    def fell_back(self) -> bool:
        """True when a requested provider is not the one that runs."""
        wanted = [_canonical(p) for p in self.requested]
        return bool(wanted) and self.provider != wanted[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "tried": self.tried,
            "skipped_unavailable": self.skipped_unavailable,
            "errors": self.errors,
            "active": self.active,
            "provider": self.provider,
        }


def _session_options(cfg: SessionConfig) -> onnxruntime.SessionOptions:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, GRAPH_LEVELS[cfg.graph_optimization_level]
    )
    so.log_severity_level = (
        _LOG_SEVERITY["default"] if cfg.log_severity_level is None else cfg.log_severity_level
    )
    if cfg.optimized_model_filepath:
        so.optimized_model_filepath = str(cfg.optimized_model_filepath)
    if cfg.intra_op_num_threads:
        so.intra_op_num_threads = cfg.intra_op_num_threads
    if cfg.inter_op_num_threads:
        so.inter_op_num_threads = cfg.inter_op_num_threads
    entries = dict(cfg.config_entries)
    if cfg.external_data_dir:
        entries["session.model_external_initializers_file_folder_path"] = str(cfg.external_data_dir)
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    if cfg.enable_profiling:
        so.enable_profiling = True
        if cfg.profile_file_prefix:
            so.profile_file_prefix = cfg.profile_file_prefix
    return so


#: What ONNX Runtime puts around the reason a model does not load: its error code, the path it was given,
#: and the C++ source line and signature that raised.
_ORT_NOISE = (
    re.compile(r"^\w+: (?=\[ONNXRuntimeError\])"),
    re.compile(r"\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : "),
    re.compile(r"Load model from .*? failed:"),
    re.compile(r"\S+\.(?:cc|cpp|h):\d+ (?:[\w:~<>]+\([^()]*\) )?"),
)


def load_reason(error: str) -> str:
    """The first line of ONNX Runtime's error, without its code, the model's path or C++ source locations."""
    reason = first_line(error, limit=len(error))  # cut after the noise is gone, not before
    for pattern in _ORT_NOISE:
        reason = pattern.sub("", reason)
    return reason.strip() or error.strip()


def create_session(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    config: SessionConfig | None = None,
    **overrides: object,
) -> tuple[onnxruntime.InferenceSession, SessionInfo]:
    """Create an ``onnxruntime.InferenceSession`` with provider fallback.

    ``model`` is a path, serialized bytes or an ``onnx.ModelProto``; ``overrides`` are :class:`SessionConfig`
    fields replacing ``config``'s. Returns ``(session, SessionInfo)``.
    Each provider is tried in order; its error is kept and the next is tried; CPU comes last.
    """
    import onnxruntime as ort

    cfg = config or SessionConfig()
    if overrides:
        cfg = SessionConfig(**{**cfg.__dict__, **overrides})
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        path = resolve_model_path(model)
        load_onnx(path, weights=False)  # typed errors and external-data locations before ORT reads anything
        model = str(path)
    order, skipped = resolve_providers(list(cfg.providers))
    warn_unavailable(skipped, order)
    so = _session_options(cfg)
    errors: dict[str, str] = {}
    for i, provider in enumerate(order):
        chain = order[i:]
        opts = [cfg.provider_options.get(p, {}) for p in chain]
        disabled = cfg.disabled_optimizers
        if disabled is None:
            disabled = CPU_DISABLED_OPTIMIZERS if chain == [CPU] else ()
        try:
            sess = ort.InferenceSession(
                model,
                sess_options=so,
                providers=chain,
                provider_options=opts,
                disabled_optimizers=list(disabled) or None,
            )
        except Exception as exc:  # noqa: BLE001 - recorded and reported, then the next provider is tried
            errors[provider] = f"{type(exc).__name__}: {exc}"
            if i + 1 < len(order):
                log.warning(
                    "provider %s failed (%s); falling back to %s",
                    provider,
                    first_line(errors[provider]),
                    order[i + 1],
                )
            continue
        info = SessionInfo(list(cfg.providers), order[: i + 1], skipped, errors, list(sess.get_providers()))
        return sess, info
    if CPU in errors:  # the CPU provider is always there: it failing means the model, not a provider
        what = model if isinstance(model, str) else "the model"
        raise OnnxFileError(
            f"ONNX Runtime cannot load {what}: {load_reason(errors[CPU])[:400]}",
            hint="check it with `modelexport validate MODEL`; re-export it if it was edited or truncated",
        )
    raise ProviderError(f"no execution provider could create a session: {errors}")
