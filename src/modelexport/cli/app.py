"""Entry point: global options, lazy command registry, logging, and error-to-message mapping."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import click

from .._config import closest
from .._version import __version__
from ..errors import ModelExportError
from ..runtime.session import set_log_severity
from .display import MAX_COLUMNS, LogFormatter
from .display import message as message_line
from .hints import EXIT_CODES, hint_for
from .options import VALUE_CHECKS

__all__ = ["cli", "main", "COMMANDS"]

#: Command name -> "module:attribute". Commands are imported only when used (fast --help).
COMMANDS: dict[str, str] = {
    "export": "modelexport.cli.export:export_cmd",
    "metadata": "modelexport.cli.metadata:metadata_cmd",
    "infer": "modelexport.cli.infer:infer_cmd",
    "quantize": "modelexport.cli.optimize:quantize_cmd",
    "optimize": "modelexport.cli.optimize:optimize_cmd",
    "analyze": "modelexport.cli.inspect:analyze_cmd",
    "validate": "modelexport.cli.inspect:validate_cmd",
    "compare": "modelexport.cli.inspect:compare_cmd",
    "extract": "modelexport.cli.inspect:extract_cmd",
    "profile": "modelexport.cli.inspect:profile_cmd",
    "report": "modelexport.cli.report:report_cmd",
    "evaluate": "modelexport.cli.evaluate:evaluate_cmd",
    "pipeline": "modelexport.cli.pipeline:pipeline_cmd",
}

_STATE: dict[str, Any] = {"debug": False, "command": None, "options": None}
#: Commands that never start ONNX Runtime's own tools (whose C++ warnings the quiet default hides).
_NO_ORT = frozenset({"analyze", "metadata", "validate", "extract"})


class LazyGroup(click.Group):
    """A click group that imports each command's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return _checked(getattr(importlib.import_module(module_name), attr))


class _Choice(click.Choice):
    """A choice whose error names the closest valid value and every valid one."""

    def get_invalid_choice_message(self, value: object, ctx: click.Context | None) -> str:
        valid = [str(c) for c in self.choices]
        guess = closest(value, valid)
        mean = f" (did you mean {guess!r}?)" if guess else ""
        return f"{str(value)[:80]!r} is not valid{mean}; valid: {', '.join(valid)}."


def _checked(command: click.Command) -> click.Command:
    """Every command's choices say "did you mean", and an unknown option that shares its first letters
    with options such as ``-O1``..``-O4`` is named whole (``-O5``), with them, not as ``-O``."""
    if getattr(command, "_modelexport_checked", False):
        return command
    for param in command.params:
        if type(param.type) is click.Choice:
            param.type.__class__ = _Choice
        check = next((VALUE_CHECKS[o] for o in param.opts if o in VALUE_CHECKS), None)
        if check is not None and param.callback is None:
            param.callback = check
    parse_args = command.parse_args

    def parse_with_prefixes(ctx: click.Context, args: list[str]) -> list[str]:
        _check_joined_options(ctx, command, args)
        return parse_args(ctx, args)

    command.parse_args = parse_with_prefixes  # type: ignore[method-assign]
    command._modelexport_checked = True  # type: ignore[attr-defined]
    return command


def _check_joined_options(ctx: click.Context, command: click.Command, args: list[str]) -> None:
    """click reads ``-O5`` as ``-O`` with the value 5 and says "No such option '-O'"; name ``-O5``."""
    names = {o for p in command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    for arg in args:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if arg.startswith("-") and not arg.startswith("--") and len(name) > 2 and name not in names:
            similar = sorted(n for n in names if len(n) > 2 and n[:2] == name[:2] and not n.startswith("--"))
            if similar and name[:2] not in names:
                like = ", ".join(similar)
                raise click.NoSuchOption(name, f"No such option '{name}'; options like it: {like}.", ctx=ctx)


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": MAX_COLUMNS}
)
@click.version_option(__version__, prog_name="modelexport")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="Logging verbosity of the library.",
)
@click.option(
    "--debug", is_flag=True, help="Print full tracebacks on errors; --log-level applies to every library."
)
@click.pass_context
def cli(ctx: click.Context, log_level: str, debug: bool) -> None:
    """modelexport: export PyTorch / Hugging Face models to hierarchy-tagged ONNX, inspect, optimize and run them."""
    _STATE["debug"] = debug
    _STATE["command"] = ctx.invoked_subcommand
    command = cli.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
    if command is not None:
        _STATE["options"] = {o for p in command.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    setup_logging(
        getattr(logging, log_level.upper()), debug, onnxruntime=ctx.invoked_subcommand not in _NO_ORT
    )


def setup_logging(level: int, debug: bool, onnxruntime: bool = True) -> None:
    """Quiet by default: modelexport's own messages at ``level`` (WARNING unless ``--log-level``); other
    libraries' warnings (Python warnings, their loggers, ONNX Runtime's and Ray's C++ logs) only with
    ``--debug``, which shows every library at ``level``. Errors always show."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter())
    logging.basicConfig(handlers=[handler])  # only where the application has not set up logging itself
    logging.getLogger().setLevel(level if debug else logging.ERROR)
    logging.getLogger("modelexport").setLevel(level)
    if debug:
        return
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"modelexport(\.|$)")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    if onnxruntime:  # its failures come back as exceptions, printed in one line; its logs repeat them
        set_log_severity(4)
        logging.getLogger("onnxruntime").setLevel(logging.CRITICAL)  # its Python tools (quant_pre_process)


def _report(exc: BaseException) -> int:
    """Print one clear message (and a hint, spelled for the command run); the traceback only with --debug."""
    if _STATE["debug"]:
        traceback.print_exception(exc)
    message = str(exc) or type(exc).__name__
    click.secho(message_line(f"Error: {message}"), fg="red", err=True)
    hint = hint_for(exc, _STATE["command"], _STATE["options"])
    if hint:
        click.echo(message_line(f"Hint: {hint}"), err=True)

    known = isinstance(exc, ModelExportError | OSError | MemoryError)
    if not known and not _STATE["debug"]:
        click.echo("This looks like a bug in modelexport; run with --debug for the traceback.", err=True)
    return EXIT_CODES["error"] if known else EXIT_CODES["unexpected"]


def main(argv: list[str] | None = None, *, prog_name: str | None = None) -> int:
    """Run the CLI and return its exit code (the console script exits with it).

    ``prog_name`` runs ``argv[0]``'s command on its own under that name (``python pipeline.py``): its usage
    line and help name what the user typed, with the same checks, logging and error messages."""
    args = list(argv if argv is not None else sys.argv[1:])
    _STATE["debug"] = "--debug" in args
    if prog_name is not None:
        return _run(lambda: _standalone(args[0], args[1:], prog_name))
    return _run(lambda: cli.main(args=args, prog_name="modelexport", standalone_mode=False))


def _standalone(name: str, args: list[str], prog_name: str) -> Any:
    """One command of the group run by itself (what ``cli`` does before a subcommand, then the command)."""
    ctx = click.Context(cli, info_name="modelexport")
    command = cli.get_command(ctx, name)
    assert command is not None, name
    _STATE["command"] = name
    _STATE["options"] = {o for p in command.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    setup_logging(logging.WARNING, bool(_STATE["debug"]), onnxruntime=name not in _NO_ORT)
    return command.main(
        args=args,
        prog_name=prog_name,
        standalone_mode=False,
        help_option_names=["-h", "--help"],
        max_content_width=MAX_COLUMNS,
    )


def _run(invoke: Callable[[], Any]) -> int:
    try:
        rv = invoke()
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return EXIT_CODES["interrupted"]
    except click.UsageError as exc:
        _usage_error(exc)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return EXIT_CODES["interrupted"]
    except Exception as exc:  # noqa: BLE001 - the one place errors become messages
        return _report(exc)
    return rv if isinstance(rv, int) else 0


def _usage_error(exc: click.UsageError) -> None:
    """click's usage error, with the message wrapped to the terminal (a long list of choices stays readable)."""
    if exc.ctx is not None:
        click.echo(message_line(exc.ctx.get_usage()), err=True)
        click.echo(f"Try '{exc.ctx.command_path} --help' for help.\n", err=True)
    click.echo(message_line(f"Error: {exc.format_message()}"), err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
