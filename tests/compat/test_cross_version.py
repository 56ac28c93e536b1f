"""A package exported under one transformers major version runs under the other, with equal outputs.

`make test-compat` runs this under transformers 4.57 with ``MODELEXPORT_OTHER_PYTHON`` naming the main
environment's interpreter (transformers 5): each side exports the packages of :mod:`.cross_env`, and every
package runs on both sides. The exporting versions are recorded in the metadata.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelexport._transformers import transformers_version
from modelexport.metadata.schema import KEY_LIBRARIES
from modelexport.metadata.store import read_metadata
from modelexport.onnxfile import resolve_model_path
from tests.compat.cross_env import KINDS, export_all, run_all
from tests.helpers import assert_nested_close

ROOT = Path(__file__).resolve().parents[2]
OTHER = os.environ.get("MODELEXPORT_OTHER_PYTHON", "")

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not OTHER, reason="needs MODELEXPORT_OTHER_PYTHON (the other environment's python): make test-compat"
    ),
]


def _other(*args: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [OTHER, "-m", "tests.compat.cross_env", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _other_version() -> str:
    code = "from modelexport._transformers import transformers_version as v; print(v())"
    return subprocess.run([OTHER, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Side -> kind -> package folder: exported here and exported by the other environment."""
    here = export_all(tmp_path_factory.mktemp("here"))
    there = _other("export", str(tmp_path_factory.mktemp("there")))
    return {"here": here, "there": there}


@pytest.mark.must
def test_the_environments_differ_in_their_transformers_major_version() -> None:
    assert transformers_version().split(".")[0] != _other_version().split(".")[0]


@pytest.mark.must
@pytest.mark.parametrize("side", ["here", "there"])
def test_packages_give_the_same_outputs_under_both_versions(
    packages: dict[str, dict[str, str]], side: str, tmp_path: Path
) -> None:
    listed = tmp_path / "packages.json"
    listed.write_text(json.dumps(packages[side]))
    ours, theirs = run_all(packages[side]), _other("run", str(listed))
    assert set(ours) == set(theirs) == set(KINDS)
    for kind in KINDS:
        assert_nested_close(ours[kind], theirs[kind], tol=1e-5)


@pytest.mark.must
def test_the_exporting_versions_are_recorded(packages: dict[str, dict[str, str]]) -> None:
    for side, version in (("here", transformers_version()), ("there", _other_version())):
        for kind, folder in packages[side].items():
            libraries = read_metadata(resolve_model_path(folder))[KEY_LIBRARIES]
            assert libraries["transformers"] == version and libraries["torch"], (side, kind)
    assert sys.executable != OTHER
