"""``modelexport metadata MODEL.onnx``: print the embedded metadata; ``--set key=value`` edits it atomically."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import ConfigError
from ..metadata import read_metadata, write_metadata
from .display import echo

__all__ = ["metadata_cmd", "parse_assignment"]


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value``: the value is JSON when it parses as JSON, else the plain string; empty deletes."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    if raw == "":
        return key.strip(), None
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def _render(meta: dict[str, Any], keys: tuple[str, ...]) -> str:
    lines = []
    for key in sorted(meta):
        if keys and key not in keys:
            continue
        value = meta[key]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        lines.append(f"{key}: {text}")
    return "\n".join(lines)


@click.command("metadata")
@click.argument("model", type=click.Path(exists=True))
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a key (JSON or text); KEY= deletes it. Repeatable.",
)
@click.option("--key", "keys", multiple=True, help="Print only these keys (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the full metadata as JSON.")
@click.option(
    "--force", is_flag=True, help="With --set: accept metadata that fails its checksum and re-sign it."
)
def metadata_cmd(
    model: str, assignments: tuple[str, ...], keys: tuple[str, ...], as_json: bool, force: bool
) -> int:
    """Print (or edit) the metadata embedded in MODEL (a .onnx file or an export folder)."""

    if assignments:
        meta = write_metadata(model, dict(parse_assignment(a) for a in assignments), verify=not force)
    else:
        meta = read_metadata(model)
    if not meta:
        echo(f"{model}: no embedded metadata (re-export without --no-embed-metadata)")
        return 0
    if as_json:
        click.echo(json.dumps({k: meta[k] for k in meta if not keys or k in keys}, indent=2, sort_keys=True))
    else:
        echo(_render(meta, keys), more="--json (or --key KEY --json)", wrap=False)
    return 0
