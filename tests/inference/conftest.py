"""Tiny task models exported once per session and shared read-only by the metadata, inference and runtime tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.inference.tiny_tasks import CNN_LABELS, CNN_PROCESSOR, plain_cnn, save_task_model

_SOURCES: dict[str, Path] = {}  # module-level: shared by every conftest that imports these fixtures


@pytest.fixture(scope="session")
def task_source(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``task_source(name)`` -> the Hugging Face folder (model + processor) of tiny task model ``name``."""

    def get(name: str) -> Path:
        if name not in _SOURCES:
            _SOURCES[name] = save_task_model(name, tmp_path_factory.mktemp(f"src_{name}"))
        return _SOURCES[name]

    return get


@pytest.fixture(scope="session")
def task_export(export_cache: Any, task_source: Any) -> Any:
    """``task_export(name)`` -> the ExportResult of tiny task model ``name`` (exported once)."""
    return lambda name: export_cache.get(f"task_{name}", str(task_source(name)))


_PLAIN: dict[str, Any] = {}  # module-level: shared by every conftest that imports these fixtures


def plain_cnn_export(root: Path, name: str, **options: Any) -> Any:
    """Export the plain CNN once per (name) in this session (ExportCache cannot key dict options)."""
    import modelexport

    if name not in _PLAIN:
        _PLAIN[name] = modelexport.export(plain_cnn(), root / name, input_shape=(2, 1, 8, 8), **options)
    return _PLAIN[name]


@pytest.fixture(scope="session")
def cnn_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The plain-torch CNN on 8 x 8 grayscale images, exported with task, labels and pre-processing."""
    return plain_cnn_export(
        tmp_path_factory.getbasetemp(),
        "plain_cnn",
        task="image-classification",
        id2label=CNN_LABELS,
        processor_config=CNN_PROCESSOR,
    )


@pytest.fixture(scope="session")
def cnn_nometa_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same CNN exported with ``embed_metadata=False``."""
    return plain_cnn_export(tmp_path_factory.getbasetemp(), "plain_cnn_nometa", embed_metadata=False)


@pytest.fixture(scope="session")
def cnn_static_export(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The CNN with every axis fixed (batch 2): pipelines must pad the batch and cut the outputs back."""
    return plain_cnn_export(
        tmp_path_factory.getbasetemp(),
        "plain_cnn_static",
        static_shapes=True,
        task="image-classification",
        id2label=CNN_LABELS,
        processor_config=CNN_PROCESSOR,
    )
