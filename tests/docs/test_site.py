"""The documentation site: every page is in the navigation, the README stays a front page whose links resolve,
and the site builds strictly (what ``make docs`` runs in CI)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.runner import ROOT

DOCS = ROOT / "docs"


def _nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") : text.index("\nplugins:")]
    return set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M))


@pytest.mark.smoke
def test_every_page_is_in_the_navigation_and_every_entry_exists() -> None:
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = _nav_pages()
    assert pages == nav, f"not in nav: {sorted(pages - nav)}; missing files: {sorted(nav - pages)}"


@pytest.mark.smoke
def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in link:
            assert (ROOT / link).exists(), f"README links to a missing {link}"
    numbers = re.findall(r"\b\d+\.\d+x\b|\b\d+(?:\.\d+)? ms\b", text)
    assert not numbers, f"measurements belong in docs/benchmarks.md: {numbers}"


@pytest.mark.integration
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cli = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    assert all(f"modelexport {name}" in cli for name in ("export", "quantize", "evaluate", "pipeline"))
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "ExportConfig" in api and "quantization_advice" in api
