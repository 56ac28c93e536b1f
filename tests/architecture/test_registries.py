"""One registry type: every name -> entry table that implementations join with a decorator is a
``modelexport._registry.Registry``, never a module dict filled by a hand-written decorator.

A hand-written registry has one shape: a module-level dict that a function writes into, from a decorator's
inner function or from a ``register*`` function. The registry type gives each of them the same order, alias,
duplicate refusal and unknown-name error; a dict filled this way would drift from them.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "modelexport"
#: The registry type itself.
HOME = "_registry.py"


def _module_dicts(tree: ast.Module) -> set[str]:
    """Names the module binds to a dict (``X = {}``, ``X: dict[...] = ...``, ``X = dict(...)``)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value, annotation = node.targets[0], node.value, None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target, value, annotation = node.target, node.value, node.annotation
        else:
            continue
        dict_value = isinstance(value, ast.Dict | ast.DictComp) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict"
        )
        dict_annotation = annotation is not None and ast.unparse(annotation).startswith(("dict[", "Dict["))
        if dict_value or dict_annotation:
            names.add(target.id)
    return names


def _writes(fn: ast.AST, names: set[str]) -> list[str]:
    """The module dicts in ``names`` that ``fn``'s own body (nested functions included) writes an item of."""
    found = []
    for node in ast.walk(fn):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AugAssign)
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id in names
            ):
                found.append(target.value.id)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in names
            and node.func.attr in ("setdefault", "update")
        ):
            found.append(node.func.value.id)
    return found


def hand_written_registries(text: str) -> list[str]:
    """``function -> DICT`` for each decorator closure or ``register*`` function that fills a module dict."""
    tree = ast.parse(text)
    names = _module_dicts(tree)
    found: list[str] = []
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for fn in functions:
        nested = [
            n for n in ast.walk(fn) if n is not fn and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        closures = [n for n in nested if _writes(n, names)]
        if closures or fn.name.lstrip("_").startswith("register"):
            found += [f"{fn.name} -> {name}" for name in dict.fromkeys(_writes(fn, names))]
    return found


OLD_SHAPE = """
TABLE: dict[str, int] = {}

def register_thing(name):
    def deco(fn):
        TABLE[name] = fn
        return fn
    return deco

def register_direct(spec):
    TABLE[spec.name] = spec
"""


def test_the_check_sees_a_hand_written_registry() -> None:
    assert hand_written_registries(OLD_SHAPE) == ["register_thing -> TABLE", "register_direct -> TABLE"]
    assert hand_written_registries("CACHE = {}\n\ndef remember(k, v):\n    CACHE[k] = v\n") == []


def test_no_module_fills_a_dict_from_a_decorator() -> None:
    found = {
        path.relative_to(SRC).as_posix(): hand_written_registries(path.read_text(encoding="utf-8"))
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() != HOME
    }
    assert not {k: v for k, v in found.items() if v}, "use modelexport._registry.Registry"


def test_one_registry_type() -> None:
    classes = {
        path.relative_to(SRC).as_posix(): node.name
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Registry")
    }
    assert classes == {HOME: "Registry"}
