"""The package's layers import downward only, with no function-local imports hiding a cycle.

Ranks, low to high: the core (errors, file I/O, ONNX files) -> hierarchy -> metadata -> runtime ->
test-time engine -> data -> inference (processors, pipelines, evaluation) -> optimize -> export (which
composes quantization for ``export --quantize``) -> inspect, batch (dataset-scale inference) -> train (DSPy) -> workflow (the end-to-end
pipeline) -> cli. A module may import its own layer or a lower one; importing the package's own modules
inside a function is refused (it is how upward imports and cycles hide); the few that only defer a heavy
library (torch, dspy) so that ``--help`` stays fast are declared in ``DEFERS_HEAVY_LIBRARY`` with the reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "modelexport"
RANKS = {
    **dict.fromkeys(
        (
            "errors",
            "_version",
            "_config",
            "_io",
            "_numeric",
            "_progress",
            "_stages",
            "_transformers",
            "onnxfile",
        ),
        0,
    ),
    "hierarchy": 1,
    "metadata": 2,
    "runtime": 3,
    "testtime": 4,
    "data": 5,
    "inference": 6,
    "optimize": 7,
    "export": 8,
    "inspect": 9,
    "batch": 9,
    "train": 10,
    "workflow": 11,
    "cli": 12,
    **dict.fromkeys(("__init__", "__main__"), 13),
}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


#: Function-local imports that only defer a heavy library (file -> why); nothing else may import inside a function.
DEFERS_HEAVY_LIBRARY = {
    "train/networks.py": "train.cnn defines torch modules; `--help` lists networks without torch",
    "cli/pipeline.py": "workflow imports the DSPy programs and torch; `pipeline --help` needs neither",
    "export/loading.py": "export.embedder defines torch modules; `import modelexport` (infer) stays torch-free",
}


def _layer(parts: tuple[str, ...]) -> str:
    return parts[0].removesuffix(".py") if parts else "__init__"


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(target layer, line, is function-local) of each import of the package's own modules."""
    rel = path.relative_to(SRC).parts
    package = rel[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # module level, including ``if TYPE_CHECKING:`` blocks
    top = {id(n) for n in tree.body} | {
        id(n) for block in tree.body if isinstance(block, ast.If) for n in block.body
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = (*base, *(node.module.split(".") if node.module else ()))
            if not target:  # ``from . import x`` in the root package
                target = tuple(a.name for a in node.names[:1])
        elif node.module and node.module.split(".")[0] == "modelexport":
            target = tuple(node.module.split(".")[1:])
        else:
            continue
        found.append((_layer(target), node.lineno, id(node) not in top))
    return found


def test_every_layer_has_a_rank() -> None:
    layers = {_layer(p.relative_to(SRC).parts) for p in _modules()}
    assert layers <= set(RANKS), f"give these layers a rank: {sorted(layers - set(RANKS))}"


@pytest.mark.must
def test_layers_import_downward_only() -> None:
    upward = []
    for path in _modules():
        own = _layer(path.relative_to(SRC).parts)
        for target, line, _ in _imports(path):
            if RANKS[target] > RANKS[own]:
                upward.append(f"{path.relative_to(SRC)}:{line} ({own}) imports {target}")
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.must
def test_no_function_local_imports_of_the_package() -> None:
    hidden = [
        f"{path.relative_to(SRC)}:{line} imports {target} inside a function"
        for path in _modules()
        for target, line, local in _imports(path)
        if local and path.relative_to(SRC).as_posix() not in DEFERS_HEAVY_LIBRARY
    ]
    assert not hidden, "\n".join(hidden)


def test_no_import_strings_naming_the_package_outside_the_lazy_maps() -> None:
    """``"modelexport.x:name"`` strings are for the public lazy map and the CLI's command table only."""
    allowed = {SRC / "__init__.py", SRC / "cli" / "app.py"}
    pattern = re.compile(r"[\"']modelexport\.[a-z_.]+:[A-Za-z_]+[\"']")
    offenders = [
        str(p.relative_to(SRC))
        for p in _modules()
        if p not in allowed and pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert not offenders, offenders
