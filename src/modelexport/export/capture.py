"""Capture a graph with torch.onnx: one registered function per exporter, same settings for the
tagged export and for the plain baseline (so the topology check compares like with like)."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._registry import Registry
from ..errors import ExportError, FixedAxisError, InputSpecError, UnsupportedOperatorError, first_line
from .experts import every_expert_runs
from .inputs import ExampleInputs, OtherSize
from .parity import flatten_outputs

if TYPE_CHECKING:
    import onnx
    import onnx_ir
    import torch

__all__ = ["CaptureSettings", "EXPORTER_REGISTRY", "capture"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureSettings:
    """What both the tagged export and the baseline are made with."""

    exporter: str
    opset: int | None
    output_names: tuple[str, ...] | None
    static_shapes: bool
    keep_batchnorm: bool
    keep_dropout: bool


CaptureFn = Callable[["torch.nn.Module", ExampleInputs, CaptureSettings], "onnx.ModelProto"]
EXPORTER_REGISTRY: Registry[CaptureFn] = Registry("exporter")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.onnx prints progress and many warnings; keep the user's console for our messages."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels, strict=True):
            lg.setLevel(lvl)


@contextlib.contextmanager
def training_modes(model: torch.nn.Module, keep_dropout: bool) -> Iterator[None]:
    """Put the model in its export state and restore it afterwards.

    eval() everything (with ``keep_dropout``, Dropout layers stay in train mode: MC dropout), and
    switch off a config's ``use_cache`` so the graph returns no key/value cache.
    """
    import torch.nn as nn

    before = {m: m.training for m in model.modules()}
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    model.eval()
    if keep_dropout:
        for m in model.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd):
                m.train()
    if use_cache:
        config.use_cache = False
    try:
        yield
    finally:
        for m, was in before.items():
            m.training = was
        if use_cache:
            config.use_cache = use_cache


@contextlib.contextmanager
def _no_grad(model: torch.nn.Module) -> Iterator[None]:
    """Capture an inference graph: no autograd, parameters not requiring grad.

    With grad enabled, torch.export records autograd-only ops (relative position bias tables,
    weight-norm convolutions) that the ONNX decomposition step cannot lower; an inference graph
    has none of them. The baseline capture runs under the same state, so topology stays comparable.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        with torch.no_grad():
            yield
    finally:
        for p in params:
            p.requires_grad_(True)


@EXPORTER_REGISTRY.register("dynamo")
def _dynamo(model: torch.nn.Module, inputs: ExampleInputs, s: CaptureSettings) -> onnx.ModelProto:
    if (other := inputs.other_size) is not None and not s.static_shapes:
        program = _to_onnx(_program_with_free_axes(model, inputs, other), inputs, s)
        program.rename_axes(_axis_names(program.model, inputs))  # torch.onnx names only string axes
        return program.model_proto
    dynamic = None if s.static_shapes else inputs.dynamo_shapes()
    return _to_onnx(model, inputs, s, dynamic).model_proto


def _to_onnx(
    model: torch.nn.Module | torch.export.ExportedProgram,
    inputs: ExampleInputs,
    s: CaptureSettings,
    dynamic: dict[str, Any] | None = None,
) -> torch.onnx.ONNXProgram:
    """torch.onnx's dynamo export of a module or of an ``ExportedProgram`` (the same translation)."""
    import torch

    return torch.onnx.export(
        model,
        (),
        kwargs=inputs.forward_kwargs(),
        dynamo=True,
        input_names=inputs.names,
        output_names=list(s.output_names) if s.output_names else None,
        dynamic_shapes=dynamic,
        opset_version=s.opset,
        optimize=not s.keep_batchnorm,  # the optimizer folds BatchNorm into Conv
        verbose=False,
        report=False,
    )


def _program_with_free_axes(
    model: torch.nn.Module, inputs: ExampleInputs, other: OtherSize
) -> torch.export.ExportedProgram:
    """torch.export's program with the free axes left to torch (``Dim.AUTO``), run at the other size before
    the ONNX translation (the costly half): a program that holds only the example's size there (a guard on
    it, a size baked in) raises :class:`FixedAxisError` after a second rather than after the whole export."""
    import torch

    expired = [False]
    try:
        with _cpu_time_limit(other.export_budget_s, expired):
            program = torch.export.export(
                model,
                (),
                kwargs=inputs.forward_kwargs(),
                dynamic_shapes=inputs.export_shapes(),
                strict=False,  # guards stay guards (torch.onnx defers them to asserts): fewer nodes to
                # translate, and a guard on the size fails the check at the other size all the same
            )
    except (_OutOfTime, Exception) as exc:  # noqa: BLE001 - any failure here means the axes cannot stay free
        if expired[0]:  # _OutOfTime, or the error of a C call it fired in (which wraps it in its own)
            raise FixedAxisError(
                f"torch.export took over {other.export_budget_s:.3g} CPU s with {other.axes} free"
            ) from exc
        raise FixedAxisError(f"torch.export cannot leave {other.axes} free: {first_line(exc)}") from exc
    module = program.module()
    problem = other.mismatch(
        lambda: [t for _, t in flatten_outputs(module(**other.kwargs))], "torch.export's graph"
    )
    if problem:
        raise FixedAxisError(problem)
    return program


class _OutOfTime(BaseException):
    """Raised in the main thread when :func:`_cpu_time_limit` runs out; a BaseException, so that no
    ``except Exception`` inside torch swallows it."""


@contextlib.contextmanager
def _cpu_time_limit(seconds: float | None, expired: list[bool] | None = None) -> Iterator[None]:
    """Raise :class:`_OutOfTime` after ``seconds`` of the process's CPU time (a virtual timer: another
    process's load does not count). Only in the main thread with SIGVTALRM unclaimed; elsewhere no limit.
    ``expired[0]`` is set when it fires: a C function that was running then may raise its own error instead."""
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGVTALRM) in (signal.SIG_DFL, None)
    )
    if not usable:
        yield
        return

    armed = [True]

    def expire(signum: int, frame: FrameType | None) -> None:
        if armed[0]:  # a signal still pending when the block ended is ignored
            if expired is not None:
                expired[0] = True
            raise _OutOfTime

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        try:
            armed[0] = False
        finally:  # restored even when the timer fires on the way out (else the next limit is never set)
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, previous)


def _axis_names(model: onnx_ir.Model, inputs: ExampleInputs) -> dict[str, str]:
    """torch's symbol -> our name for each dynamic input axis of ``model`` (an ``onnx_ir`` model); a free
    axis torch fixed, or two names on one symbol, is a :class:`FixedAxisError`."""
    wanted = inputs.axis_names()
    renames: dict[str, str] = {}
    for value in model.graph.inputs:
        for axis, name in wanted.get(value.name, {}).items():
            symbol = value.shape[axis]
            if isinstance(symbol, int) or not isinstance(getattr(symbol, "value", None), str):
                raise FixedAxisError(f"torch.export fixed {name} at {symbol}")
            if renames.setdefault(symbol.value, name) != name:
                raise FixedAxisError(f"torch.export made {name} equal to {renames[symbol.value]}")
    return renames


@contextlib.contextmanager
def _forward_taking_only(model: torch.nn.Module, names: list[str]) -> Iterator[None]:
    """Give ``model.forward`` a signature of exactly ``names`` while tracing; restore it after.

    The torchscript exporter turns keyword inputs into positional ones by filling in every
    parameter of ``forward``; decorators that add keywords themselves (transformers'
    ``use_cache``) then receive them twice. Scopes come from module calls, so tags are unchanged.
    """
    import inspect

    original = model.forward
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def forward(*args: object, **kwargs: object) -> Any:
        bound = dict(zip(names, args, strict=False))
        return original(**bound, **kwargs)

    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    model.forward = forward
    try:
        yield
    finally:
        del model.forward  # the instance attribute goes; the class's forward is back
        if model.forward != original:  # pragma: no cover - forward was an instance attribute before
            model.forward = original


@EXPORTER_REGISTRY.register("torchscript")
def _torchscript(model: torch.nn.Module, inputs: ExampleInputs, s: CaptureSettings) -> onnx.ModelProto:
    import onnx
    import torch

    buffer = io.BytesIO()
    training = torch.onnx.TrainingMode.PRESERVE if s.keep_dropout else torch.onnx.TrainingMode.EVAL
    with _forward_taking_only(model, inputs.parameters):
        torch.onnx.export(
            model,
            tuple(inputs.tensors.values()),
            buffer,
            dynamo=False,
            input_names=inputs.names,
            output_names=list(s.output_names) if s.output_names else None,
            dynamic_axes=inputs.dynamic_axes(s.static_shapes),
            opset_version=s.opset or 17,
            do_constant_folding=not (s.keep_batchnorm or s.keep_dropout),
            training=training,
        )
    return onnx.load_from_string(buffer.getvalue())


#: How each exporter names an operator it cannot convert.
_OP_PATTERNS = [
    re.compile(r"No ONNX function found for <OpOverload\(op='([\w.:]+)'"),  # dynamo
    re.compile(r"Exporting the operator '?([\w:.]+)'? to ONNX"),  # torchscript, known namespace
    re.compile(r"unrecognized namespace ([\w:.]+)"),  # torchscript, custom namespace
]


def _unsupported_op(text: str) -> str | None:
    for pat in _OP_PATTERNS:
        m = pat.search(text)
        if m:
            return m.group(1).rstrip(".")
    return None


def capture(model: torch.nn.Module, inputs: ExampleInputs, settings: CaptureSettings) -> onnx.ModelProto:
    """Export ``model`` with the chosen exporter and return the ``onnx.ModelProto``; typed errors."""
    fn = EXPORTER_REGISTRY[settings.exporter]
    try:
        with (
            _quiet(),
            training_modes(model, settings.keep_dropout),
            _no_grad(model),
            every_expert_runs(model),
        ):
            return fn(model, inputs, settings)
    except FixedAxisError:
        raise  # the caller captures with those axes fixed
    except (TypeError, IndexError) as exc:
        if "argument" in str(exc) or "positional" in str(exc):
            raise InputSpecError(f"the example inputs do not match forward(): {exc}") from exc
        raise ExportError(f"{settings.exporter} export failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        text = f"{exc}\n{exc.__cause__ or ''}"
        op = _unsupported_op(text)
        if op:
            raise UnsupportedOperatorError(
                f"the {settings.exporter} exporter cannot convert operator {op!r} to ONNX"
                f" (opset {settings.opset or 'default'}): check that your model's ops are ONNX compliant"
            ) from exc
        first = first_line(exc)
        other = "torchscript" if settings.exporter == "dynamo" else "dynamo"
        raise ExportError(
            f"{settings.exporter} export failed: {type(exc).__name__}: {first[:500]}",
            hint=f"check that your model's ops are ONNX compliant; try --exporter {other} or another --opset",
        ) from exc
