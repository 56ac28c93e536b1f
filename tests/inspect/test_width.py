"""Human-readable inspect output fits a 100-column terminal; --wide and machine formats are never cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelexport.cli.app import main
from modelexport.inspect.formats import TERMINAL_WIDTH, fit_width


@pytest.mark.smoke
def test_fit_width_marks_the_cut() -> None:
    assert fit_width("short\n" + "x" * 120, 100).split("\n") == ["short", "x" * 99 + "\u2026"]


@pytest.mark.smoke
@pytest.mark.parametrize("command", [["analyze"], ["profile", "--runs", "2", "--warmup", "0"]])
def test_text_fits_the_terminal_unless_wide(
    tiny_bert_export: Any, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_bert_export.output_dir)
    assert main([command[0], model, *command[1:]]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert narrow and max(len(line) for line in narrow) <= TERMINAL_WIDTH
    assert main([command[0], model, *command[1:], "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in wide) > TERMINAL_WIDTH  # the tiny BERT's op lists are longer


@pytest.mark.smoke
def test_json_is_never_cut(tiny_bert_export: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tiny_bert_export.output_dir), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_nodes"] > 0
