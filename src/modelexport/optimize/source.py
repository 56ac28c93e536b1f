"""The input of a transform (``quantize``, ``optimize``), checked before any work or output.

A transform copies its input's metadata and sidecar onto its output and signs the result. Carrying a value
that fails its checksum would launder it: the output would hold an edit nobody made with modelexport under
a fresh, valid checksum. So the metadata is verified (checksum and value rules) and the sidecar's node map
compared with the graph's node tags first; a mismatch refuses the run with the file and the repair.

ONNX Runtime also loads the input first: its quantizers and the graph tools accept some graphs the runtime
refuses (a ``Loop`` without its body, an input nothing produces, an initializer larger than its data), and
their output would not load either.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..errors import MetadataError, MetadataIntegrityError, OnnxFileError
from ..hierarchy.graph import sidecar_mismatches
from ..hierarchy.tags import read_node_tags
from ..metadata import read_metadata
from ..onnxfile import load_onnx, read_sidecar, sidecar_path_for
from ..runtime.session import SessionConfig, create_session

__all__ = ["check_carried", "check_loads", "check_sources"]

_RESIGN = "if you edited it yourself, re-sign it with `modelexport metadata MODEL --set KEY=VALUE --force`"


def check_carried(src: Path) -> None:
    """Refuse ``src`` when its metadata or sidecar does not verify (what a transform would carry and sign)."""
    try:
        read_metadata(src)
    except MetadataIntegrityError as exc:
        raise MetadataIntegrityError(
            f"{src}: {exc}; its metadata is not carried into a new file as if it were valid",
            hint=f"check it with `modelexport metadata MODEL`; re-export the model, or {_RESIGN}",
        ) from exc
    except MetadataError as exc:
        raise MetadataError(f"{src}: {exc}", hint=exc.hint) from exc
    sidecar = read_sidecar(src)
    if sidecar is None:
        return
    found = sidecar_mismatches(
        read_node_tags(load_onnx(src, weights=False)), sidecar.get("nodes") or {}, limit=1
    )
    if found:
        raise MetadataIntegrityError(
            f"{sidecar_path_for(src)} does not describe {src.name} ({found[0]}); "
            "it is not carried into a new file as if it were valid",
            hint="`modelexport validate MODEL --check-consistency` lists the differences; "
            "`modelexport validate MODEL --repair` makes the sidecar and the node tags agree again",
        )


#: ONNX Runtime's words for a valid graph whose op has no kernel in this build's CPU provider (a float16 graph
#: made for a GPU): the transforms still read it, so it is not refused.
_NO_CPU_KERNEL = "Could not find an implementation for"


def check_loads(src: Path) -> None:
    """Refuse ``src`` when ONNX Runtime cannot build a session of it (an OnnxFileError naming the file and ONNX
    Runtime's reason), except for an op without a CPU kernel. Graph optimizations are off: only loading counts."""
    try:
        session, _ = create_session(
            src, SessionConfig(graph_optimization_level="disable", log_severity_level=4)
        )
    except OnnxFileError as exc:
        if _NO_CPU_KERNEL not in str(exc):
            raise
        return
    del session


def check_sources(files: Iterable[Path]) -> None:
    """:func:`check_loads`, then :func:`check_carried`, on each graph file a transform reads."""
    for file in files:
        check_loads(file)
        check_carried(file)
