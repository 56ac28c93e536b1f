"""The CLI tests reuse the session's tiny task exports."""

from __future__ import annotations

from tests.inference.conftest import task_export, task_source  # noqa: F401 - session fixtures
