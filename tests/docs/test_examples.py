"""Every shell and Python example in README.md and docs/ runs as written, and every line the CLI prints
while running them fits 100 columns (``COLUMNS=100``), so no example and no command's output can rot.

One test per page: its blocks run in order in one working directory that starts with the artifacts the page
names (``tests/docs/workspace.py``). Blocks marked slow run in ``make test-slow``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelexport.cli.app import COMMANDS
from tests.docs.blocks import read_page
from tests.docs.runner import MAX_COLUMNS, ROOT, Measured, Runner
from tests.docs.workspace import ARTIFACTS, Workspace

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_MEASURED = Measured()
_RAN: set[str] = set()


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(scope="session")
def docs_workspace(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("docs"), minilm_dir)


@contextlib.contextmanager
def _environment(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a reader's shell has: a 100-column terminal, MiniLM in the Hugging Face cache, no network."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(ws.hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(ws.hub))
    monkeypatch.setenv("COLUMNS", str(MAX_COLUMNS))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


def _run_page(path: Path, ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    page = read_page(path, ROOT)
    if not page.blocks:
        pytest.skip(f"{page.name} has no examples")
    with _environment(ws, monkeypatch):
        ws.prepare(tmp_path, page.needs)
        Runner(page, tmp_path, _MEASURED, include_slow=slow).run()
    _RAN.add(page.name)


@pytest.mark.smoke
@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_examples_run(
    path: Path, docs_workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_page(path, docs_workspace, tmp_path, monkeypatch, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_examples_run_with_slow_ones(
    path: Path, docs_workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_page(path, docs_workspace, tmp_path, monkeypatch, slow=True)


@pytest.mark.smoke
def test_every_command_was_measured() -> None:
    """Every command ran in text mode in some example (so the width check covered it)."""
    if len(_RAN) < len([p for p in PAGES if read_page(p, ROOT).blocks]):
        pytest.skip("only a subset of the pages ran")
    missing = sorted(set(COMMANDS) - set(_MEASURED.commands))
    assert not missing, f"no example runs these commands in text mode: {missing}"
    assert max(_MEASURED.commands.values()) <= MAX_COLUMNS


@pytest.mark.smoke
def test_pages_name_known_artifacts_and_every_block_is_known() -> None:
    for path in PAGES:
        page = read_page(path, ROOT)
        assert set(page.needs) <= set(ARTIFACTS), (
            f"{page.name}: unknown artifacts {set(page.needs) - set(ARTIFACTS)}"
        )
        for block in page.blocks:
            assert block.mode in {"run", "file", "slow", "exit", "check"}, (
                f"{block.label}: {block.directive!r}"
            )
            if block.mode in ("file", "check"):
                assert block.argument, f"{block.label}: '{block.mode}' needs a file name or a reason"
