"""Cross-area flows reuse the session's tiny task exports."""

from tests.inference.conftest import task_export, task_source  # noqa: F401 - session fixtures
