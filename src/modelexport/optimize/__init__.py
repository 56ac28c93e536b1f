"""Optimize for inference: int8 quantization and graph optimization that keep tags and metadata."""

from __future__ import annotations

__all__: list[str] = []
