"""The CLI as a whole: entry points, global options, --help everywhere."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from modelexport.cli.app import COMMANDS, cli, main


@pytest.mark.smoke
def test_python_dash_m_is_the_console_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "modelexport", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("modelexport, version ")


@pytest.mark.smoke
def test_help_does_not_import_torch() -> None:
    code = "import sys; from modelexport.cli.app import main; main(['--help']); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "False", (
        "--help should stay fast: torch is imported lazily"
    )


@pytest.mark.smoke
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_documents_every_option(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    text = capsys.readouterr().out
    command = cli.get_command(click.Context(cli), name)
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts[0]} has no help text"
            assert param.opts[0] in text


@pytest.mark.smoke
def test_unknown_command_and_bad_log_level_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert main(["--log-level", "LOUD", "export", "--help"]) == 2
    assert "LOUD" in capsys.readouterr().err


@pytest.mark.smoke
def test_log_level_debug_is_applied(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    assert main(["--log-level", "DEBUG", "export", "--help"]) == 0
    assert logging.getLogger("modelexport").level == logging.DEBUG
    main(["--log-level", "WARNING", "export", "--help"])
    assert logging.getLogger("modelexport").level == logging.WARNING
