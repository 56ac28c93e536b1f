"""Free image axes: height and width dynamic in the graph where the model takes another size, fixed at the
example's size where it does not. Decided by behaviour, never by architecture, cheapest check first, so a
model whose size is fixed exports exactly as before and about as fast:

1. PyTorch runs the model eagerly at another size (one patch/stride step taller, two wider: the model's own
   divisibility holds, and a height/width mix-up shows). A vision transformer whose position embeddings
   have one size fails here and is captured with the fixed size, no symbolic shape inside its graph (so
   its attention still fuses).
2. torch.export captures with those axes left to torch (``Dim.AUTO``), and its graph runs at the other size
   before the ONNX translation (the costly half): a guard on the size, or a size baked in (a relative
   position table resized to sizes torch turned into numbers), fails there within a second.
3. The ONNX graph runs at the other size against PyTorch, within the export's tolerance.

A failure in 2 or 3 re-captures with the fixed size, and the export notes say why.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FixedAxisError, first_line
from ..onnxfile import needs_external_data, save_onnx
from ..runtime.session import create_session
from .capture import CaptureSettings, capture, training_modes
from .context import ExportContext
from .inputs import ExampleInputs, OtherSize, modality_config
from .parity import PARITY_RUNNERS, flatten_outputs, runner_for

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_STEP", "capture_graph", "probe_other_size", "size_step"]

#: The step where neither a patch size nor the outputs show one: the deepest stride of common CNNs.
DEFAULT_STEP = 32
#: CPU seconds torch.export may take with free axes: this much, plus this much per torch call of the eager
#: run. Measured: 4-22 ms per call for convolutional and vision-transformer graphs, 290 ms for window
#: attention that pads to window multiples (whose size arithmetic sympy reasons about for minutes, and
#: whose graph then fails at the other size anyway).
EXPORT_BUDGET_S, EXPORT_BUDGET_PER_CALL_S = 5.0, 0.05


def size_step(
    module: torch.nn.Module, inputs: ExampleInputs, reference: list[tuple[str, torch.Tensor]]
) -> int:
    """One patch/stride step of the model: the lcm of its config's patch size and the stride its spatial
    outputs show (input size / output size; a 1x1 pooled output shows nothing), else :data:`DEFAULT_STEP`."""
    steps: set[int] = set()
    config = getattr(module, "config", None)
    for name, axes in inputs.free_axes.items():
        patch = getattr(modality_config(config, name) or config, "patch_size", None)
        patch = patch[0] if isinstance(patch, (list, tuple)) and patch else patch
        if isinstance(patch, int) and not isinstance(patch, bool) and patch > 0:
            steps.add(patch)
        shape = tuple(inputs.tensors[name].shape)
        for _, out in reference:
            dims = tuple(out.shape)
            if len(dims) == len(shape) and all(
                1 < dims[a] < shape[a] and shape[a] % dims[a] == 0 for a in axes
            ):
                steps.update(shape[a] // dims[a] for a in axes)
    return math.lcm(*steps) if steps else DEFAULT_STEP


def probe_other_size(
    module: torch.nn.Module,
    inputs: ExampleInputs,
    reference: list[tuple[str, torch.Tensor]],
    atol: float,
    scaled: bool,
) -> tuple[OtherSize | None, str]:
    """PyTorch at another size (eager, milliseconds): the :class:`OtherSize` when the model runs there with
    outputs of the same number and ranks, else None; and what happened, in words."""
    import torch

    step = size_step(module, inputs, reference)
    shapes = {
        name: _grown(tuple(inputs.tensors[name].shape), axes, step) for name, axes in inputs.free_axes.items()
    }
    tensors = inputs.resized(shapes)
    kwargs = replace(inputs, tensors=tensors).forward_kwargs()
    axes = "/".join(dict.fromkeys(n for a in inputs.free_axes.values() for n in a.values()))
    other = OtherSize(tensors, kwargs, [], shapes, axes, atol, scaled)
    counter = _call_counter()
    try:
        with torch.no_grad(), training_modes(module, keep_dropout=False), counter:
            out = flatten_outputs(module(**kwargs))
    except Exception as exc:  # noqa: BLE001 - any failure at the other size means the size is fixed
        return (
            None,
            f"{axes} fixed: PyTorch fails at {other.label} ({type(exc).__name__}: {first_line(exc)})",
        )
    if [(n, t.dim()) for n, t in out] != [(n, t.dim()) for n, t in reference]:
        return None, f"{axes} fixed: PyTorch's outputs at {other.label} differ in number or rank"
    budget = EXPORT_BUDGET_S + EXPORT_BUDGET_PER_CALL_S * counter.calls
    tried = f"PyTorch runs at {other.label} ({counter.calls} torch calls): {axes} tried dynamic"
    return replace(other, reference=out, export_budget_s=budget), tried


def _call_counter() -> Any:
    """A torch function mode that counts the torch calls of a forward: the size of what torch.export traces."""
    from torch.overrides import TorchFunctionMode

    class CallCounter(TorchFunctionMode):
        calls = 0

        def __torch_function__(
            self,
            func: Callable[..., Any],
            types: Collection[type],
            args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            self.calls += 1
            return func(*args, **(kwargs or {}))

    return CallCounter()


def _grown(shape: tuple[int, ...], axes: dict[int, str], step: int) -> tuple[int, ...]:
    """``shape`` with the first free axis ``step`` larger, the next ``2 * step``, and so on."""
    grown = list(shape)
    for i, axis in enumerate(sorted(axes)):
        grown[axis] += (i + 1) * step
    return tuple(grown)


def capture_graph(ctx: ExportContext, settings: CaptureSettings) -> None:
    """Set ``ctx.model_proto``, and ``ctx.inputs`` to the inputs it was captured with: the free axes
    dynamic where the model takes another size (checked there), else fixed exactly as before."""
    cfg, module = ctx.config, ctx.loaded.module
    if ctx.inputs.free_axes:
        _probe(ctx)
    other, problem = ctx.inputs.other_size, None
    with ctx.stages.stage("capture", f"{cfg.exporter}, opset {cfg.opset or 'default'}") as st:
        try:
            ctx.model_proto = capture(module, ctx.inputs, settings)
        except FixedAxisError as exc:
            problem = st["detail"] = str(exc)
    if other is not None and problem is None:
        with ctx.stages.stage("size_check", f"ONNX at {other.label} vs PyTorch") as st:
            problem = _onnx_mismatch(ctx, other)
            st["detail"] = problem or f"{other.axes} dynamic: ONNX matches PyTorch at {other.label}"
        # the topology check captures again: the same way, with no time limit to hit on a busy machine
        ctx.inputs = replace(ctx.inputs, other_size=replace(other, export_budget_s=None))
    if other is not None and problem is not None:
        ctx.notes.append(f"image {other.axes} fixed at the example's size: {problem}")
        ctx.inputs = ctx.inputs.fixed()
        with ctx.stages.stage("capture", f"{cfg.exporter}, {other.axes} fixed"):
            ctx.model_proto = capture(module, ctx.inputs, settings)


def _probe(ctx: ExportContext) -> None:
    """``ctx.inputs`` trying the free axes where PyTorch runs at another size, else with them fixed."""
    cfg = ctx.config
    if cfg.static_shapes or cfg.keep_dropout:
        ctx.inputs = ctx.inputs.fixed()
        if cfg.keep_dropout and not cfg.static_shapes:
            ctx.stages.skip("size_probe", "dropout kept active: outputs at another size cannot be compared")
        return
    with ctx.stages.stage("size_probe", "PyTorch at another image size") as st:
        scaled = cfg.dtype != "float32"
        other, st["detail"] = probe_other_size(
            ctx.loaded.module, ctx.inputs, ctx.reference, cfg.tolerance, scaled
        )
    ctx.inputs = ctx.inputs.trying(other) if other else ctx.inputs.fixed()


def _onnx_mismatch(ctx: ExportContext, other: OtherSize) -> str | None:
    """Why the captured graph does not give PyTorch's outputs at the other size, or None."""
    proto, dtype = ctx.model_proto, ctx.config.dtype
    with tempfile.TemporaryDirectory(dir=ctx.staging_dir) as tmp:
        big = needs_external_data(proto)  # over protobuf's 2 GB: from a file, weights beside it
        model = save_onnx(proto, Path(tmp) / "model.onnx") if big else proto.SerializeToString()
        return other.mismatch(lambda: _onnx_outputs(model, other.feeds(), dtype), "the ONNX graph")


def _onnx_outputs(model: bytes | Path, feeds: dict[str, np.ndarray], dtype: str) -> list[np.ndarray]:
    """The graph's outputs on the parity runner for ``dtype``; ONNX Runtime without its error log (a graph
    failing at the other size is an answer here, not an error to print)."""
    runner = runner_for(dtype)
    if runner != "onnxruntime":
        return PARITY_RUNNERS[runner](model, feeds)[1]
    session, _ = create_session(model, log_severity_level=4)
    wanted = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in wanted})
