"""The tiny task exports are shared with tests/inference (one export per model per session)."""

from tests.inference.conftest import cnn_export, cnn_nometa_export, task_export, task_source  # noqa: F401
