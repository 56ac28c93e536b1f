"""Export's package steps are typed: each is ``step(ExportContext, PackageState) -> PackageState``, what they
share is a frozen dataclass of named fields (no string-keyed dict), and the layers below export receive their
own inputs, never export's context (not even duck-typed as a ``ctx`` parameter)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

from modelexport.export.context import ExportContext
from modelexport.export.package import PACKAGE_STEPS, PackageState
from modelexport.metadata.build import BuiltMetadata, ExportFacts
from modelexport.metadata.embed import EmbeddedMetadata, MetadataStats
from modelexport.metadata.package import GraphSet, Manifest, PackageFiles
from modelexport.optimize.export_pass import GraphVariant, VariantSource

SRC = Path(__file__).resolve().parents[2] / "src" / "modelexport"
#: Layers export builds on (tests/architecture/test_layers.py ranks them below export).
BELOW_EXPORT = ("hierarchy", "metadata", "runtime", "testtime", "data", "inference", "optimize", "onnxfile")


def test_each_package_step_maps_state_to_state() -> None:
    for step in PACKAGE_STEPS:
        params = list(inspect.signature(step).parameters.values())
        hints = typing.get_type_hints(step)
        assert [p.name for p in params] == ["ctx", "state"], step.__name__
        assert hints == {"ctx": ExportContext, "state": PackageState, "return": PackageState}, step.__name__


def test_step_inputs_and_results_are_frozen_dataclasses() -> None:
    typed = (
        PackageState,
        ExportFacts,
        BuiltMetadata,
        EmbeddedMetadata,
        MetadataStats,
        Manifest,
        GraphSet,
        PackageFiles,
        VariantSource,
        GraphVariant,
    )
    for cls in typed:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls.__name__


def test_no_string_keyed_side_channel() -> None:
    """The context holds no open ``dict[str, Any]`` (its ``files`` map a role to a file name), and no state
    field is a bare ``Any``: what a step hands on has a name and a type."""
    assert not [f.name for f in dataclasses.fields(ExportContext) if "Any" in str(f.type)]
    assert not [f.name for f in dataclasses.fields(PackageState) if str(f.type) == "Any"]


def test_layers_below_export_never_take_its_context() -> None:
    found = []
    for layer in BELOW_EXPORT:
        for path in sorted((SRC / layer).rglob("*.py")) if (SRC / layer).is_dir() else []:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                    found += [
                        f"{path.relative_to(SRC)}:{node.lineno} {a.arg}" for a in args if a.arg == "ctx"
                    ]
                if isinstance(node, ast.Name) and node.id == "ExportContext":
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} ExportContext")
    assert not found
