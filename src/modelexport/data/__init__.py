"""Labelled datasets for training, evaluation and test-time policy search (text, images, arrays).

``load_dataset(path_or_spec)`` reads CSV/TSV/JSON/JSONL, image folders, CSVs of image paths, ``.npz``
and built-ins such as ``sklearn:digits`` into one :class:`Dataset` with a stratified ``split``.
"""

from __future__ import annotations

from .dataset import KINDS, Dataset, encode_labels
from .readers import (
    BUILTINS,
    IMAGE_SUFFIXES,
    READERS,
    ReadOptions,
    load_dataset,
    register_reader,
)

__all__ = [
    "Dataset",
    "KINDS",
    "load_dataset",
    "encode_labels",
    "register_reader",
    "READERS",
    "BUILTINS",
    "ReadOptions",
    "IMAGE_SUFFIXES",
]
