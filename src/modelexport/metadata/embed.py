"""Embed an export's metadata into its graph, timed and measured (what the manifest's ``stats`` records)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .build import ExportFacts, build_metadata
from .schema import encode_entries
from .store import update_metadata

__all__ = ["EmbeddedMetadata", "MetadataStats", "embed_metadata"]


@dataclass(frozen=True)
class MetadataStats:
    """How long building and embedding the metadata took, and its encoded size."""

    extract_ms: float
    bytes: int

    def to_dict(self) -> dict[str, float | int]:
        return {"extract_ms": self.extract_ms, "bytes": self.bytes}


@dataclass(frozen=True)
class EmbeddedMetadata:
    """The metadata embedded in the graph (decoded), its stats, and notes for the user."""

    values: dict[str, Any]
    stats: MetadataStats
    notes: tuple[str, ...] = ()


def embed_metadata(facts: ExportFacts) -> EmbeddedMetadata:
    """Build the schema-2.0 metadata of ``facts`` and embed it into ``facts.proto`` (in place)."""
    start = time.perf_counter()
    built = build_metadata(facts)
    update_metadata(facts.proto, built.values)
    size = sum(len(k) + len(v) for k, v in encode_entries(built.values).items())
    ms = (time.perf_counter() - start) * 1000
    return EmbeddedMetadata(built.values, MetadataStats(round(ms, 2), size), built.notes)
