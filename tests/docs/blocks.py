"""The examples of a Markdown page: its fenced shell and Python blocks, each with what the page says about it.

A block runs as written unless an HTML comment right above it (invisible on the page) says otherwise:

- ``<!-- docs: file NAME -->``: the block is a file the next blocks use (a model factory, input specs): it is
  written to ``NAME`` in the page's working directory, not run.
- ``<!-- docs: slow -->``: runs in ``make test-slow`` only (minutes: the full pipeline, Ray, encoder-decoders).
- ``<!-- docs: exit N -->``: each command is expected to exit with ``N`` (examples of errors).
- ``<!-- docs: check REASON -->``: needs what a test machine lacks (a GPU, a running Ray cluster, a browser, a
  benchmark-only package): each ``modelexport`` command is parsed against the command's real options, not run;
  a Python block is compiled, not run.

A page says which prepared artifacts its working directory starts with in ``<!-- docs: needs a, b -->``.
Commands that install or build (``pip``, ``make``, ``git clone``) are checked, not run: the extras and
targets they name must exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Page", "read_page", "commands", "RUN_LANGUAGES"]

#: Fenced block languages that are examples to run.
RUN_LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python", "py": "python"}
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced example: its language (``shell``/``python``), text, line and directive."""

    page: str
    line: int
    kind: str
    text: str
    directive: str = ""

    @property
    def mode(self) -> str:
        """``run``, ``file``, ``slow``, ``check`` or ``exit``."""
        return self.directive.split(" ", 1)[0] if self.directive else "run"

    @property
    def argument(self) -> str:
        return self.directive.split(" ", 1)[1].strip() if " " in self.directive else ""

    @property
    def label(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    path: Path
    name: str
    needs: tuple[str, ...] = ()
    blocks: list[Block] = field(default_factory=list)


def read_page(path: Path, root: Path) -> Page:
    """The runnable blocks of a Markdown file (``root``: where names are relative to)."""
    name = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    page = Page(path, name)
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        if directive and directive.group("body").startswith("needs "):
            page.needs += tuple(n.strip() for n in directive.group("body")[6:].split(",") if n.strip())
        fence = _FENCE.match(line)
        if not fence:
            i += 1
            continue
        indent, lang = fence.group("indent"), fence.group("lang").lower()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = "\n".join(x[len(indent) :] if x.startswith(indent) else x for x in lines[i + 1 : end])
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        match = _DIRECTIVE.match(above)
        text = match.group("body") if match and not match.group("body").startswith("needs ") else ""
        if lang in RUN_LANGUAGES or text.startswith("file "):  # a file may be any language (JSON specs)
            page.blocks.append(Block(name, i + 1, RUN_LANGUAGES.get(lang, lang), body, text))
        i = end + 1
    return page


def commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comment lines and blank lines left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
