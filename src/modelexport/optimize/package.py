"""Quantize or optimize every graph of a multi-graph package (an encoder-decoder's three graphs) into a new one.

``modelexport quantize FOLDER -o OUTDIR/`` on a package whose manifest lists ``components`` runs the same
per-file transform on each graph (the set the folder deploys: an ``export --optimize`` package's optimized
graphs) and writes a complete package into ``OUTDIR``: each graph under its exported name
(``encoder_model.onnx``, ...: Optimum's defaults, so ``ORTModelForSeq2SeqLM.from_pretrained(OUTDIR)`` loads
it), its sidecar, the config, processor and generation files, and a manifest naming the graphs. As
``optimum-cli onnxruntime quantize --onnx_model FOLDER`` quantizes every model of a folder. The output
follows the one output rule (:mod:`modelexport.onnxfile.output`): nothing is written unless every graph
succeeds (one staging folder, moved into place at the end).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError
from ..onnxfile import (
    PACKAGE_MANIFEST,
    OutputPlan,
    component_names,
    package_components,
    plan_output,
    sidecar_path_for,
    staged_output,
    write_derived_manifest,
)
from .carry import copy_package_files, package_file_names

__all__ = ["PackageResult", "is_multi_graph", "transform_package"]

#: A graph's own result (QuantizeResult, OptimizeResult), which records its output paths.
_Result = TypeVar("_Result")


def is_multi_graph(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a package folder whose manifest lists several graphs."""
    return Path(path).is_dir() and bool(component_names(path))


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


def _plan(
    src: Path, output_dir: str | os.PathLike[str], names: dict[str, str], overwrite: bool
) -> OutputPlan:
    """The package's output plan: every graph, its sidecar, the package files and the manifest, in a folder."""
    first = next(iter(names.values()))
    graphs = [n for name in names.values() for n in (name, sidecar_path_for(name).name)]
    target = Path(output_dir)
    package = [*graphs[1:], *package_file_names(src, target), PACKAGE_MANIFEST]
    plan = plan_output(
        output_dir,
        first,
        inputs=[src, *package_components(src).values()],
        package=package,
        bare_is_folder=True,
        package_folder=True,
        overwrite=overwrite,
    )
    if not plan.is_folder:
        raise ConfigError(
            f"{src} is a package of {len(names)} graphs ({', '.join(names.values())}); -o must name a folder, "
            f"not {target.name}",
            hint=f"pass -o OUTDIR/, or one graph file ({src / first}) to transform it alone",
        )
    return plan


def _moved(result: _Result, staging: Path, dst: Path) -> _Result:
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
    *,
    overwrite: bool = False,
) -> PackageResult:
    """``run(graph file, output file)`` on every graph of the package in ``folder``; a package in ``output_dir``
    (a folder by the one output rule; ``overwrite`` replaces an earlier package of ours there)."""
    src = Path(folder)
    names = component_names(src)
    plan = _plan(src, output_dir, names, overwrite)
    graphs = package_components(src)  # the set the folder deploys
    with staged_output(plan) as stage:
        staging = stage.path
        results = {role: run(file, staging / names[role]) for role, file in graphs.items()}
        copy_package_files(src, staging, package_file_names(src, plan.folder))
        write_derived_manifest(src, staging, names)
        files = sorted(p.name for p in staging.iterdir())
    dst = plan.folder
    return PackageResult(src, dst, kind, {r: _moved(v, staging, dst) for r, v in results.items()}, files)
