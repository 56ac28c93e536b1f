"""The module tree of an ``nn.Module`` and the rules that turn module paths into tags.

Universal rules only: a module is a tag level unless it is a plain ``torch.nn`` building block
(Linear, Dropout, activations, containers...), except the configurable exceptions (norms and
embeddings by default). The root is always a level. Distinct kept modules always get distinct tags.
A model is never collapsed onto its root: when most scoped nodes would land on the root tag while
they come from several of the root's named children, those children become levels, named
``Class.attribute`` (``/Shared/Sequential.mix``, ``/Shared/Linear.proj``): see :meth:`ModuleTree.reveal`.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["TagRules", "ModuleInfo", "ModuleTree", "DEFAULT_TORCH_NN_EXCEPTIONS"]

#: torch.nn classes that stay tag levels although they are plain building blocks (glob patterns).
DEFAULT_TORCH_NN_EXCEPTIONS: tuple[str, ...] = (
    "LayerNorm",
    "Embedding",
    "BatchNorm*",
    "GroupNorm",
    "InstanceNorm*",
)


@dataclass(frozen=True)
class TagRules:
    """Which modules become tag levels."""

    torch_nn_exceptions: tuple[str, ...] = DEFAULT_TORCH_NN_EXCEPTIONS
    include_torch_nn: bool = False

    def keeps(self, module: torch.nn.Module) -> bool:
        if self.include_torch_nn or not _is_torch_nn(module):
            return True
        name = type(module).__name__
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.torch_nn_exceptions)


def _is_torch_nn(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("torch.nn.")


@dataclass
class ModuleInfo:
    """What the sidecar records for one module (R9)."""

    path: str
    class_name: str
    qualified_class: str
    kept: bool
    tag: str = ""
    forward_args: list[str] = field(default_factory=list)
    direct_parameters: list[str] = field(default_factory=list)
    inherited_parameters: list[str] = field(default_factory=list)
    children: dict[str, str] = field(default_factory=dict)
    call_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.class_name,
            "qualified_class": self.qualified_class,
            "tag": self.tag,
            "is_tag_level": self.kept,
            "forward_args": self.forward_args,
            "parameters": {"direct": self.direct_parameters, "inherited": self.inherited_parameters},
            "children": self.children,
            "call_count": self.call_count,
        }


def _forward_args(module: torch.nn.Module) -> list[str]:
    try:
        return [p for p in inspect.signature(module.forward).parameters]
    except (TypeError, ValueError):
        return []


class ModuleTree:
    """Module path -> info and tag; ``""`` is the root."""

    def __init__(self, root: torch.nn.Module, rules: TagRules | None = None) -> None:
        self.rules = rules or TagRules()
        self.modules: dict[str, torch.nn.Module] = dict(root.named_modules(remove_duplicate=False))
        self.info: dict[str, ModuleInfo] = {}
        for path, module in self.modules.items():
            cls = type(module)
            direct = [n for n, _ in module.named_parameters(recurse=False)]
            everything = [n for n, _ in module.named_parameters()]
            self.info[path] = ModuleInfo(
                path=path,
                class_name=cls.__name__,
                qualified_class=f"{cls.__module__}.{cls.__qualname__}",
                kept=path == "" or self.rules.keeps(module),
                forward_args=_forward_args(module),
                direct_parameters=direct,
                inherited_parameters=[n for n in everything if n not in direct],
                children={name: type(child).__name__ for name, child in module.named_children()},
            )
        self.revealed: set[str] = set()  # root children made levels by :meth:`reveal`
        self._assign_tags()

    # -- paths ---------------------------------------------------------------------------------
    @staticmethod
    def parent(path: str) -> str | None:
        if path == "":
            return None
        return path.rpartition(".")[0]

    def ancestors(self, path: str) -> list[str]:
        """Paths from the root down to ``path`` (inclusive)."""
        out = [path]
        while (p := self.parent(out[-1])) is not None:
            out.append(p)
        return out[::-1]

    def __contains__(self, path: str) -> bool:
        return path in self.modules

    # -- tags ----------------------------------------------------------------------------------
    def _segment(self, path: str) -> str:
        info = self.info[path]
        if path == "":
            return info.class_name
        parent = self.parent(path)
        name = path.rpartition(".")[2]
        siblings = Counter(self.info[parent].children.values()) if parent is not None else Counter()
        if name.isdigit() or siblings[info.class_name] > 1 or path in self.revealed:
            return f"{info.class_name}.{name}"
        return info.class_name

    def _compute_tag(self, path: str, levels: set[str]) -> str:
        return "/" + "/".join(self._segment(p) for p in self.ancestors(path) if p in levels)

    def _assign_tags(self) -> None:
        """Tag every kept module; if two kept modules collide, make their hidden containers levels."""
        levels = {p for p, i in self.info.items() if i.kept} | self.revealed
        for _ in range(len(self.info) + 1):
            tags = {p: self._compute_tag(p, levels) for p in levels}
            by_tag: dict[str, list[str]] = {}
            for p, t in tags.items():
                by_tag.setdefault(t, []).append(p)
            clashes = [ps for ps in by_tag.values() if len(ps) > 1]
            if not clashes:
                break
            grown = {a for ps in clashes for p in ps for a in self.ancestors(p)} - levels
            if not grown:  # nothing hidden left to reveal: cannot happen for a tree, guard anyway
                break
            levels |= grown
        for path, info in self.info.items():
            info.kept = path in levels
        for path, info in self.info.items():
            owner = self.owner(path)
            info.tag = tags[owner]
        self.tag_to_path = {tags[p]: p for p in levels}

    def reveal(self, node_counts: Mapping[str, int]) -> list[str]:
        """Never collapse a model onto its root: given scoped node counts per module path, if more
        than half land on the root tag and they come from two or more of the root's children, make
        those children levels. Returns the children revealed (none for models whose kept modules
        already hold most nodes, e.g. every Hugging Face model: their tags stay as they are)."""
        total = sum(node_counts.values())
        on_root = {p: n for p, n in node_counts.items() if p in self.info and self.owner(p) == ""}
        if not total or 2 * sum(on_root.values()) <= total:
            return []
        children = sorted({p.split(".", 1)[0] for p in on_root if p})
        if len(children) < 2:
            return []
        self.revealed |= set(children)
        self._assign_tags()
        return children

    def owner(self, path: str) -> str:
        """The nearest kept module at or above ``path``."""
        for p in reversed(self.ancestors(path)):
            if self.info[p].kept:
                return p
        return ""

    def tag_of(self, path: str) -> str:
        return self.info[path].tag

    @property
    def root_tag(self) -> str:
        return self.info[""].tag

    # -- call counts ---------------------------------------------------------------------------
    def count_calls(self, root: torch.nn.Module, run: Callable[[], object]) -> None:
        """Run ``run()`` with forward hooks on every module and record how often each is called."""
        handles = []
        by_id: dict[int, list[str]] = {}
        for path, module in self.modules.items():
            by_id.setdefault(id(module), []).append(path)

        def hook(module: torch.nn.Module, args: tuple[object, ...], output: object) -> None:
            for path in by_id.get(id(module), []):
                self.info[path].call_count += 1

        seen: set[int] = set()
        for module in self.modules.values():
            if id(module) not in seen:
                seen.add(id(module))
                handles.append(module.register_forward_hook(hook))
        try:
            run()
        finally:
            for h in handles:
                h.remove()
