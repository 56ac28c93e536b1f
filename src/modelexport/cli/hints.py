"""One table from exception type to the hint the CLI prints (most specific type first), spelled for the
command that was run."""

from __future__ import annotations

import re
from collections.abc import Collection

from ..errors import ModelExportError

__all__ = ["hint_for", "adapt_hint", "EXIT_CODES", "SPELLINGS"]

#: Builtin errors a user can cause without our code wrapping them.
_BUILTIN_HINTS: list[tuple[type[BaseException], str]] = [
    (FileNotFoundError, "check the path"),
    (PermissionError, "check the file permissions"),
    (MemoryError, "the model or batch is too large for this machine; lower --batch-size"),
    (KeyboardInterrupt, "interrupted; no output was written"),
]

#: Exit codes: 1 for our errors, 2 for usage errors (click's), 3 for unexpected ones.
EXIT_CODES = {"error": 1, "usage": 2, "unexpected": 3, "interrupted": 130}

#: A library hint names a setting by the flag of the command it was written for (the datasets' hints by the
#: pipeline's ``--text_column``); other commands spell the same setting their own way. flag -> command -> the
#: command's flag. A flag the command run has neither as it is nor here is left out of the hint.
SPELLINGS: dict[str, dict[str, str]] = {
    "--text_column": {"infer": "--input-column"},
    "--tta-transforms": {"pipeline": "--tta_transforms"},
    "--tta_transforms": {"evaluate": "--tta-transforms"},
    "--batch-size": {"pipeline": "--batch_size"},
    "--log_level": {name: "--log-level" for name in ("export", "quantize", "optimize", "infer", "evaluate")},
}

_FLAG = re.compile(r"--[a-z][a-z0-9_-]*")
_QUOTED = re.compile(r"(`[^`]*`)")


def hint_for(
    exc: BaseException, command: str | None = None, options: Collection[str] | None = None
) -> str | None:
    """The hint for an exception: its own ``hint`` for ours, the table for builtins; with the command that
    was run and its option names, each flag spelled as that command spells it (:func:`adapt_hint`)."""
    hint = exc.hint if isinstance(exc, ModelExportError) else None
    if hint is None:
        hint = next((h for kind, h in _BUILTIN_HINTS if isinstance(exc, kind)), None)
    if hint and command and options is not None:
        return adapt_hint(hint, command, options)
    return hint


def adapt_hint(hint: str, command: str, options: Collection[str]) -> str:
    """``hint`` with each flag as ``command`` spells it; flags it lacks are left out, with their phrase.

    Text in backquotes (a whole command line, ```modelexport export MODEL --keep-batchnorm```) is another
    command's and stays as it is.
    """
    own = {o.replace("_", "-"): o for o in options}
    missing: list[str] = []

    def spell(match: re.Match[str]) -> str:
        flag = match.group(0)
        mine = own.get(flag.replace("_", "-")) or SPELLINGS.get(flag, {}).get(command)
        if mine is None and flag not in ("--help", "--debug", "--log-level"):
            missing.append(flag)
        return mine or flag

    parts = _QUOTED.split(hint)
    parts = [p if p.startswith("`") else _FLAG.sub(spell, p) for p in parts]
    text = "".join(parts)
    for flag in missing:
        text = _drop(text, flag)
    return text.strip(" ,;") or hint


def _drop(text: str, flag: str) -> str:
    """``text`` without the phrase that names ``flag``: ``(--a/--b)`` loses it, ``or pass --a`` goes."""
    f = re.escape(flag)
    text = re.sub(rf"\s*\({f}\)", "", text)
    text = re.sub(rf"\(({f})/", "(", text)
    text = re.sub(rf"/{f}\)", ")", text)
    text = re.sub(rf",? or (?:pass |give |set )?{f}(?: [A-Z_]+)?", "", text)
    return text
