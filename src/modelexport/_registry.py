"""The one name -> entry registry that implementations join with a decorator.

Tasks, pipelines, processors, readers, quantization modes, graph passes, TTA transforms... are all chosen by
name. One registry type keeps what every one of them needs in one place: registration in order (the order is
often a priority: the first matching reader, processor or task wins), optional aliases, a refusal of a name
registered twice, and one typed error for an unknown name that names the kind, the closest valid name and
every valid one (:func:`~modelexport._config.unknown_choice`). Each registry picks the error class its callers
catch (``ConfigError`` for an option, ``TestTimeError`` for a test-time setting...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from ._config import unknown_choice
from .errors import ConfigError, ModelExportError

__all__ = ["Registry"]

T = TypeVar("T")
F = TypeVar("F")


class Registry(Generic[T]):
    """Entries by name, in registration order; a lookup of an unknown name raises the registry's typed error.

    ``kind`` names the entries in messages (``unknown task 'x' (did you mean ...?); valid: ...``); ``error`` is
    the exception class raised for an unknown name and ``hint`` its hint (``None``: the class's own);
    ``key`` normalises names before they are stored or looked up (e.g. ``str.lower``).
    """

    def __init__(
        self,
        kind: str,
        *,
        error: type[ModelExportError] = ConfigError,
        hint: str | None = None,
        key: Callable[[str], str] | None = None,
    ) -> None:
        self.kind = kind
        self.error = error
        self.hint = hint
        self._key = key or (lambda name: name)
        self._entries: dict[str, T] = {}
        #: Every accepted name (registered names and aliases, in registration order) -> its registered name.
        self._names: dict[str, str] = {}

    def add(self, name: str, entry: T, *, aliases: Iterable[str] = ()) -> T:
        """Register ``entry`` as ``name`` (and ``aliases``); a name already taken is refused."""
        name = self._key(name)
        accepted = [name, *(self._key(a) for a in aliases)]
        taken = [n for n in accepted if n in self._names]
        if taken or len(set(accepted)) != len(accepted):
            raise ConfigError(
                f"{self.kind} {(taken or accepted)[0]!r} is registered twice",
                hint=f"give the new {self.kind} a name of its own",
            )
        self._entries[name] = entry
        self._names.update(dict.fromkeys(accepted, name))
        return entry

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` registers the decorated object itself."""

        def deco(entry: T) -> T:
            return self.add(name, entry, aliases=aliases)

        return deco

    def register_as(self, name: str, make: Callable[[F], T], *aliases: str) -> Callable[[F], F]:
        """Decorator that registers ``make(decorated)`` (a spec holding the function and what describes it) and
        returns the decorated function unchanged."""

        def deco(fn: F) -> F:
            self.add(name, make(fn), aliases=aliases)
            return fn

        return deco

    def canonical(self, name: str) -> str:
        """The registered name that ``name`` (a registered name or an alias) stands for."""
        found = self._names.get(self._key(name))
        if found is None:
            raise self.error(unknown_choice(self.kind, name, self._names), hint=self.hint)
        return found

    def get(self, name: str) -> T:
        """The entry for ``name`` (or one of its aliases); the registry's typed error if there is none."""
        return self._entries[self.canonical(name)]

    __getitem__ = get

    def find(self, name: str) -> T | None:
        """The entry for ``name``, or None where there is none (for callers to whom absence is not an error)."""
        found = self._names.get(self._key(name))
        return None if found is None else self._entries[found]

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def accepted(self) -> list[str]:
        """Every name a lookup accepts: registered names and their aliases, in registration order."""
        return list(self._names)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def values(self) -> list[T]:
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
