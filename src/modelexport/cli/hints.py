"""One table from exception type to the hint the CLI prints (most specific type first)."""

from __future__ import annotations

from ..errors import ModelExportError

__all__ = ["hint_for", "EXIT_CODES"]

#: Builtin errors a user can cause without our code wrapping them.
_BUILTIN_HINTS: list[tuple[type[BaseException], str]] = [
    (FileNotFoundError, "check the path"),
    (PermissionError, "check the file permissions"),
    (MemoryError, "the model or batch is too large for this machine; lower --batch-size"),
    (KeyboardInterrupt, "interrupted; no output was written"),
]

#: Exit codes: 1 for our errors, 2 for usage errors (click's), 3 for unexpected ones.
EXIT_CODES = {"error": 1, "usage": 2, "unexpected": 3, "interrupted": 130}


def hint_for(exc: BaseException) -> str | None:
    """The hint for an exception: its own ``hint`` for ours, the table for builtins."""
    if isinstance(exc, ModelExportError):
        return exc.hint
    for kind, hint in _BUILTIN_HINTS:
        if isinstance(exc, kind):
            return hint
    return None
