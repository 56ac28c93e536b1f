"""The package's layers import downward only, with no function-local imports hiding a cycle, and no circles.

Ranks, low to high: the core (errors, file I/O, ONNX files) -> hierarchy -> metadata -> runtime ->
test-time engine -> data -> inference (processors, pipelines, evaluation) -> optimize -> export (which
composes quantization for ``export --quantize``) -> inspect, batch (dataset-scale inference) -> train (DSPy) -> workflow (the end-to-end
pipeline) -> cli. A module may import its own layer or a lower one.

Every form of import is seen: ``from ... import``, ``import modelexport.x``, ``importlib.import_module`` with a
literal name, and the lazy maps (``"modelexport.x:name"`` strings, a package's ``_LAZY`` name -> submodule
table). Importing the package's own modules inside a function is refused (it is how upward imports and cycles
hide); the few single imports that only defer a heavy library (torch, dspy) so that ``--help`` stays fast are
declared in ``DEFERS_HEAVY_LIBRARY``, keyed by (file, module imported), each with its reason. Module-level imports
(``TYPE_CHECKING`` blocks included: a type that needs a circle is a design that needs one) form no circle.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "modelexport"
RANKS = {
    **dict.fromkeys(
        (
            "errors",
            "_version",
            "_config",
            "_registry",
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

#: Function-local imports that only defer a heavy library: (file, module imported) -> why. Nothing else may
#: import the package inside a function.
DEFERS_HEAVY_LIBRARY = {
    (
        "train/networks.py",
        "train.cnn",
    ): "train.cnn defines torch modules; `--help` lists networks without torch",
    (
        "cli/pipeline.py",
        "workflow",
    ): "workflow imports the DSPy programs and torch; `pipeline --help` needs neither",
    ("export/loading.py", "export.embedder"): "export.embedder defines torch modules; `import modelexport` "
    "(infer) stays torch-free",
}

#: Files that call ``importlib.import_module`` on a computed name -> what the name can be.
DYNAMIC_IMPORTS = {
    "__init__.py": "the public lazy map (_LAZY), checked as imports below",
    "export/__init__.py": "the package's lazy map (_LAZY), checked as imports below",
    "train/__init__.py": "the package's lazy map (_LAZY), checked as imports below",
    "cli/app.py": "the command table (COMMANDS), checked as imports below",
    "export/loading.py": "a user's factory module (`pkg.mod:make_model`), never the package's own",
}

#: Module-level dicts whose string values name modules imported on first use.
LAZY_MAPS = ("_LAZY", "COMMANDS")
_IMPORT_STRING = re.compile(r"^modelexport((?:\.[a-z_0-9]+)*)(?::[A-Za-z_]\w*)?$")


@dataclass(frozen=True)
class Import:
    """One import of the package's own code: by whom, of what module, how."""

    source: str  # file under src/modelexport, posix
    target: tuple[str, ...]  # module path under modelexport (() is the package itself)
    line: int
    local: bool  # inside a function (deferred to its first call)
    kind: str  # "from", "import", "import_module", "lazy map"

    @property
    def layer(self) -> str:
        return _layer(self.target)

    @property
    def module(self) -> str:
        return ".".join(self.target)


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _layer(parts: tuple[str, ...]) -> str:
    return parts[0].removesuffix(".py") if parts else "__init__"


def _package(path: Path) -> tuple[str, ...]:
    return path.relative_to(SRC).parts[:-1]


def _is_module(parts: tuple[str, ...]) -> bool:
    base = SRC.joinpath(*parts) if parts else SRC
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _file_of(parts: tuple[str, ...]) -> str:
    base = SRC.joinpath(*parts) if parts else SRC
    return _rel(base / "__init__.py") if (base / "__init__.py").is_file() else _rel(base.with_suffix(".py"))


def _from_target(node: ast.ImportFrom, package: tuple[str, ...]) -> tuple[str, ...] | None:
    if node.level:
        base = package[: len(package) - (node.level - 1)]
        return (*base, *(node.module.split(".") if node.module else ()))
    if node.module and node.module.split(".")[0] == "modelexport":
        return tuple(node.module.split(".")[1:])
    return None


def _top_level(tree: ast.Module) -> set[int]:
    """Statements that run at import: the module body and the bodies of its ``if``/``try`` blocks."""
    found: set[int] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        found.add(id(node))
        if isinstance(node, ast.If | ast.Try):
            stack += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                stack += handler.body
    return found


def _lazy_maps(tree: ast.Module, package: tuple[str, ...], source: str) -> Iterator[Import]:
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id in LAZY_MAPS and isinstance(node.value, ast.Dict)):
            continue
        for value in node.value.values:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                continue
            named = _IMPORT_STRING.match(value.value)
            if named:
                parts = tuple(p for p in named.group(1).split(".") if p)
            else:  # a submodule of this package
                parts = (*package, value.value)
            yield Import(source, parts, value.lineno, True, "lazy map")


def _imports(path: Path) -> list[Import]:
    """Every import of the package's own modules in ``path``."""
    return _imports_in(path.read_text(encoding="utf-8"), _rel(path))


def _imports_in(text: str, source: str) -> list[Import]:
    package = tuple(source.split("/")[:-1])
    tree = ast.parse(text)
    top = _top_level(tree)
    found = list(_lazy_maps(tree, package, source))
    for node in ast.walk(tree):
        local = id(node) not in top
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            if target is None:
                continue
            for alias in node.names:  # ``from . import policy`` imports the submodule policy
                sub = (*target, alias.name)
                found.append(Import(source, sub if _is_module(sub) else target, node.lineno, local, "from"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "modelexport":
                    found.append(Import(source, tuple(parts[1:]), node.lineno, local, "import"))
        elif isinstance(node, ast.Call) and _calls_import_module(node):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                named = _IMPORT_STRING.match(arg.value)
                if named:
                    parts = tuple(p for p in named.group(1).split(".") if p)
                    found.append(Import(source, parts, node.lineno, True, "import_module"))
                elif arg.value.startswith("."):
                    raise AssertionError(f"{source}:{node.lineno}: relative import_module; name the module")
            elif source not in DYNAMIC_IMPORTS:
                raise AssertionError(
                    f"{source}:{node.lineno}: import_module on a computed name; declare it in DYNAMIC_IMPORTS"
                )
    return found


def _calls_import_module(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "import_module"


_ALL = [imp for path in _modules() for imp in _imports(path)]


def test_every_layer_has_a_rank() -> None:
    layers = {_layer(p.relative_to(SRC).parts) for p in _modules()}
    assert layers <= set(RANKS), f"give these layers a rank: {sorted(layers - set(RANKS))}"


def test_every_import_names_a_module_that_exists() -> None:
    missing = [f"{i.source}:{i.line} ({i.kind}) {i.module}" for i in _ALL if not _is_module(i.target)]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_the_scan_sees_every_form() -> None:
    """The forms the issue named as holes are seen (a failing scan passes every other test vacuously)."""
    kinds = {i.kind for i in _ALL}
    assert {"from", "lazy map"} <= kinds, kinds
    assert any(i.source == "__init__.py" and i.module == "inference.pipelines.factory" for i in _ALL)
    assert any(i.source == "cli/app.py" and i.module == "cli.optimize" for i in _ALL)
    assert any(i.source == "export/__init__.py" and i.module == "export.api" for i in _ALL)
    text = (
        "import importlib\nimport modelexport.cli.app\nif True:\n    from .. import workflow\n"
        "def f():\n    from ..cli import app\n    return importlib.import_module('modelexport.batch.api')\n"
    )
    seen = {(i.module, i.local, i.kind) for i in _imports_in(text, "data/probe.py")}
    assert seen == {
        ("cli.app", False, "import"),
        ("workflow", False, "from"),
        ("cli.app", True, "from"),
        ("batch.api", True, "import_module"),
    }, seen


@pytest.mark.must
def test_layers_import_downward_only() -> None:
    upward = [
        f"{i.source}:{i.line} ({_layer(Path(i.source).parts)}) imports {i.module} ({i.kind})"
        for i in _ALL
        if RANKS[i.layer] > RANKS[_layer(Path(i.source).parts)]
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.must
def test_no_function_local_imports_of_the_package() -> None:
    hidden = [
        f"{i.source}:{i.line} imports {i.module} inside a function"
        for i in _ALL
        if i.local and i.kind in ("from", "import") and (i.source, i.module) not in DEFERS_HEAVY_LIBRARY
    ]
    assert not hidden, "\n".join(hidden)


def test_every_exemption_is_used() -> None:
    used = {(i.source, i.module) for i in _ALL if i.local}
    stale = sorted(set(DEFERS_HEAVY_LIBRARY) - used)
    assert not stale, f"exemptions no import needs any more: {stale}"
    dynamic = {_rel(p) for p in _modules() if "import_module(" in p.read_text(encoding="utf-8")}
    assert set(DYNAMIC_IMPORTS) <= dynamic, sorted(set(DYNAMIC_IMPORTS) - dynamic)


def _reexports() -> dict[str, dict[str, str]]:
    """Package ``__init__`` file -> name -> the file of its package that defines it (``from .x import name``)."""
    table: dict[str, dict[str, str]] = {}
    for path in SRC.rglob("__init__.py"):
        package = _package(path)
        names: dict[str, str] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                sub = (*package, *node.module.split("."))
                for alias in node.names:
                    names[alias.asname or alias.name] = _file_of(sub)
        table[_rel(path)] = names
    return table


def _edges() -> dict[str, set[str]]:
    """File -> the files its import-time statements import (names re-exported by a package resolved to their
    defining module, so importing ``..runtime.create_session`` is an edge to runtime/session.py)."""
    reexports = _reexports()
    graph: dict[str, set[str]] = {_rel(p): set() for p in _modules()}
    for path in _modules():
        source, package = _rel(path), _package(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level(tree)
        for node in ast.walk(tree):
            if id(node) not in top:
                continue
            if isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                if target is None:
                    continue
                for alias in node.names:
                    sub = (*target, alias.name)
                    if _is_module(sub):
                        graph[source].add(_file_of(sub))
                        continue
                    init = _file_of(target)
                    graph[source].add(reexports.get(init, {}).get(alias.name, init))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "modelexport":
                        graph[source].add(_file_of(tuple(parts[1:])))
        graph[source].discard(source)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.must
def test_no_import_circles() -> None:
    circles = _circles(_edges())
    assert not circles, "modules that import each other (at import time or for types):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


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
