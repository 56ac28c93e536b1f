"""What an export produced and what was verified: the result that ``export`` returns and the report reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .package import PackageState

__all__ = ["ExportResult"]


@dataclass
class ExportResult:
    """What an export produced and what was verified."""

    output_dir: Path
    onnx_path: Path
    hierarchy_path: Path
    exporter: str
    opset: int
    node_count: int
    coverage: dict[str, Any]
    parity: dict[str, Any] | None
    topology_identical: bool | None
    stages: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What the package steps produced (metadata and its stats, generation and embedding records, the
    #: optimized and quantized copies); None where no steps ran.
    package: PackageState | None = None
    #: A multi-graph package (encoder-decoder generation): each graph's own result, by file name.
    components: dict[str, ExportResult] = field(default_factory=dict)

    @property
    def report_path(self) -> Path | None:
        name = self.files.get("report")
        return self.output_dir / name if name else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "output_dir": str(self.output_dir),
            "onnx_path": str(self.onnx_path),
            "hierarchy_path": str(self.hierarchy_path),
            "exporter": self.exporter,
            "opset": self.opset,
            "node_count": self.node_count,
            "coverage": self.coverage,
            "parity": self.parity,
            "topology_identical": self.topology_identical,
            "stages": self.stages,
            "files": self.files,
            "notes": self.notes,
            **(
                {"components": {k: v.to_dict() for k, v in self.components.items()}}
                if self.components
                else {}
            ),
        }
