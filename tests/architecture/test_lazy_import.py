"""``import modelexport`` stays cheap, and ``modelexport.export`` means one thing in every import order."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "onnx", "onnxruntime", "modelexport.export.api", "modelexport.optimize")


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.smoke
def test_import_modelexport_loads_no_heavy_module() -> None:
    code = f"import sys, modelexport; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    assert _run(code) == "[]"


@pytest.mark.smoke
@pytest.mark.parametrize(
    "first",
    [
        "import modelexport.export.api",
        "from modelexport.export import ExportConfig",
        "from modelexport import export as e",
    ],
)
def test_export_name_is_the_callable_package_in_any_import_order(first: str) -> None:
    code = (
        f"{first}\n"
        "import modelexport, modelexport.export.api as api\n"
        "from modelexport import export\n"
        "from modelexport.export import export as fn\n"
        "assert export is modelexport.export and callable(export) and fn is api.export\n"
        "assert modelexport.export.ExportConfig is modelexport.ExportConfig\n"
        "try:\n"
        "    export('./no/such/model', '/tmp/never-written')\n"
        "except FileNotFoundError as exc:\n"
        "    print(type(exc).__module__)\n"
    )
    assert _run(code) == "modelexport.errors"
