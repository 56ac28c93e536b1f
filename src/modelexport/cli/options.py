"""Option blocks that several commands share, declared once so their names, ranges and defaults agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import click

from ..runtime.session import check_providers

__all__ = ["Decorated", "OptionValue", "ray_engine_options", "overwrite_option", "stacked", "VALUE_CHECKS"]

#: What click gives a command for one of its options: a string, number or flag, a repeatable option's tuple,
#: or None when it was left out.
OptionValue: TypeAlias = str | int | float | bool | tuple[str, ...] | None
#: A command function an option decorator returns as it got it.
Decorated = TypeVar("Decorated", bound=Callable[..., Any])


def _providers(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--ep``: every name known (``gpu`` -> did you mean 'cuda'?) before the command loads anything."""
    if value:
        check_providers(value)
    return value


#: Options whose values name registry entries, checked when the command line is parsed (before anything
#: loads) in every command that has them (``cli.app`` attaches them).
VALUE_CHECKS: dict[str, Callable[[click.Context, click.Parameter, Any], Any]] = {"--ep": _providers}


def overwrite_option(what: str = "-o", also: str = "") -> Callable[[Decorated], Decorated]:
    """``--overwrite`` of every command that writes (the one output rule, README "Where a command writes");
    ``what`` names the command's output option, ``also`` adds what it means there."""
    return click.option(
        "--overwrite",
        is_flag=True,
        help=f"Replace existing files at {what}: the file named (with its sidecar) and files an earlier modelexport "
        f"run recorded in the folder's manifest; no other file is ever replaced.{' ' + also if also else ''} "
        "Without it nothing that exists is replaced.",
    )


def ray_engine_options(engine_help: str) -> Callable[[Decorated], Decorated]:
    """``--engine local|ray``, ``--num-workers``, ``--threads-per-worker``, ``--address`` (``infer --data``,
    ``evaluate``); ``engine_help`` says what each engine does for the command."""
    options = [
        click.option(
            "--engine",
            type=click.Choice(["local", "ray"]),
            default="local",
            show_default=True,
            help=engine_help,
        ),
        click.option(
            "--num-workers",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Ray actors, one ONNX Runtime session each (--engine ray).",
        ),
        click.option(
            "--threads-per-worker",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="ONNX Runtime intra-op threads (and CPUs reserved) per worker.",
        ),
        click.option(
            "--address",
            default=None,
            help="Ray cluster to join: auto or ray://HOST:10001 (default: start a local one).",
        ),
    ]

    return stacked(options)


def stacked(options: Sequence[Callable[[Decorated], Decorated]]) -> Callable[[Decorated], Decorated]:
    """One decorator applying ``options`` in order (the first is listed first in ``--help``)."""

    def apply(fn: Decorated) -> Decorated:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply
