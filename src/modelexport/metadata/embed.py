"""Export passes: embed the metadata into the model, and write the Optimum-compatible package files."""

from __future__ import annotations

import logging
import time
from typing import Any

from .build import build_metadata
from .package import write_package_files
from .schema import encode_entries
from .store import update_metadata

__all__ = ["embed_metadata_pass", "package_pass"]

log = logging.getLogger(__name__)


def embed_metadata_pass(ctx: Any) -> None:
    """Embed the schema-2.0 metadata (unless ``embed_metadata=False``); time and size go to ``ctx.extra``."""
    if not ctx.config.embed_metadata:
        ctx.stages.skip("metadata", "--no-embed-metadata")
        return
    with ctx.stages.stage("metadata", "embed schema 2.0") as st:
        start = time.perf_counter()
        values = build_metadata(ctx)
        update_metadata(ctx.model_proto, values)
        size = sum(len(k) + len(v) for k, v in encode_entries(values).items())
        ms = (time.perf_counter() - start) * 1000
        ctx.extra["metadata"] = values
        ctx.extra["metadata_stats"] = {"extract_ms": round(ms, 2), "bytes": size}
        st["detail"] = f"{len(values)} keys, {size / 1024:.1f} KB, {ms:.0f} ms"


def package_pass(ctx: Any) -> None:
    """config.json, processor files and export_metadata.json beside model.onnx (Optimum's layout)."""
    with ctx.stages.stage("package", "Optimum-compatible folder") as st:
        written = write_package_files(ctx)
        st["detail"] = ", ".join(written) or "nothing to add"
