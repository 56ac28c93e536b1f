"""Quantize or optimize every graph of a multi-graph package (an encoder-decoder's three graphs) into a new one.

``modelexport quantize FOLDER -o OUTDIR`` on a package whose manifest lists ``components`` runs the same
per-file transform on each graph (the set the folder deploys: an ``export --optimize`` package's optimized
graphs) and writes a complete package into ``OUTDIR``: each graph under its exported name
(``encoder_model.onnx``, ...: Optimum's defaults, so ``ORTModelForSeq2SeqLM.from_pretrained(OUTDIR)`` loads
it), its sidecar, the config, processor and generation files, and a manifest naming the graphs. As
``optimum-cli onnxruntime quantize --onnx_model FOLDER`` quantizes every model of a folder. Nothing is
written unless every graph succeeds (one staging folder, moved into place at the end).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_dir
from ..errors import ConfigError, OutputWriteError
from ..onnxfile import component_names, package_components, write_derived_manifest

__all__ = ["PackageResult", "is_multi_graph", "check_output_file", "transform_package"]


def is_multi_graph(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a package folder whose manifest lists several graphs."""
    return Path(path).is_dir() and bool(component_names(path))


def check_output_file(src: Path, dst: Path) -> None:
    """A one-graph transform writes a file, never over its input nor onto a folder."""
    if src.resolve() == dst.resolve():
        raise ConfigError(f"output {dst} would overwrite the input model", hint="choose another -o path")
    if dst.is_dir():
        raise ConfigError(f"output {dst} is a folder; {src.name} is one graph", hint="pass -o PATH.onnx")


@dataclass
class PackageResult:
    """What a package transform wrote: each graph's own result by role, and the package's files."""

    input_dir: Path
    output_dir: Path
    kind: str  # "quantize" | "optimize"
    components: dict[str, Any]  # role -> QuantizeResult | OptimizeResult
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": str(self.input_dir),
            "output": str(self.output_dir),
            "kind": self.kind,
            "components": {role: r.to_dict() for role, r in self.components.items()},
            "files": self.files,
        }


def _check_output_dir(src: Path, dst: Path, names: dict[str, str]) -> None:
    graphs = ", ".join(names.values())
    if dst.resolve() == src.resolve():
        raise ConfigError(
            f"output {dst} is the input package; its graphs would be overwritten",
            hint="choose a new folder, or export with --optimize/--quantize to write copies beside the graphs",
        )
    if dst.suffix == ".onnx" or dst.is_file():
        raise ConfigError(
            f"{src} is a package of {len(names)} graphs ({graphs}); -o must name a folder, not {dst.name}",
            hint=f"pass -o OUTDIR, or one graph file ({src / next(iter(names.values()))}) to transform it alone",
        )
    present = sorted(p.name for p in dst.glob("*.onnx")) if dst.is_dir() else []
    if present:
        raise OutputWriteError(
            f"{dst} already holds model files: {', '.join(present)}",
            hint="choose an empty or new output folder",
        )


def _moved(result: Any, staging: Path, dst: Path) -> Any:
    """``result`` with the paths it recorded in the staging folder pointing into the output folder."""
    for attr in ("output_path", "sidecar_path"):
        path = getattr(result, attr, None)
        if path is not None and Path(path).parent == staging:
            setattr(result, attr, dst / Path(path).name)
    return result


def transform_package(
    folder: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    kind: str,
    run: Callable[[Path, Path], Any],
) -> PackageResult:
    """``run(graph file, output file)`` on every graph of the package in ``folder``; a package in ``output_dir``."""
    src, dst = Path(folder), Path(output_dir)
    names = component_names(src)
    _check_output_dir(src, dst, names)
    graphs = package_components(src)  # the set the folder deploys
    with atomic_dir(dst) as staging:
        results = {role: run(file, staging / names[role]) for role, file in graphs.items()}
        write_derived_manifest(src, staging, names)
        files = sorted(p.name for p in staging.iterdir())
    return PackageResult(src, dst, kind, {r: _moved(v, staging, dst) for r, v in results.items()}, files)
