"""A small name -> entry registry that implementations join with a decorator.

Transforms, aggregators, adaptation methods and corruptions are all chosen by name on the command line;
one registry type keeps the error for an unknown name the same everywhere (it lists the valid names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .._config import unknown_choice
from ..errors import TestTimeError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name; ``get`` of an unknown name raises :class:`TestTimeError` listing the valid ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")``."""

        def deco(entry: T) -> T:
            return self.add(name, entry)

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise TestTimeError(
                unknown_choice(self.kind, name, self.names()), hint=f"choose the {self.kind} from the list"
            ) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
