"""Package files are read from inside their folder: the one check for a name from a config or a fixed name.

A name that is absolute or climbs out with ``..`` is refused, and so is a symbolic link that leads out of the
folder (its target's content would end up in a package users share, or in what a command reads as the
model's). The one exception is the Hugging Face cache's own layout, where a snapshot's files link to the same
repository's ``blobs/``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import MetadataError

__all__ = ["safe_join"]


def safe_join(base: Path, name: str) -> Path:
    """``base / name`` for a relative name that stays inside ``base``; MetadataError otherwise."""
    text = str(name)
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if (
        not text
        or PurePosixPath(text).is_absolute()
        or PureWindowsPath(text).is_absolute()
        or PureWindowsPath(text).drive
        or ".." in parts
    ):
        raise MetadataError(f"refusing file name {name!r} from a config: it leaves the model folder")
    joined = base / Path(*parts)
    if not _within(joined.absolute(), base.absolute()):
        raise MetadataError(f"refusing file name {name!r} from a config: it leaves the model folder")
    target = joined.resolve()
    if not any(_within(target, root) for root in _readable_roots(base)):
        raise MetadataError(
            f"refusing {joined}: it is a symbolic link to {target}, outside the model folder",
            hint="copy the file into the folder (not a link) if it belongs to the model, or remove the link",
        )
    return joined


def _within(path: Path, root: Path) -> bool:
    return path.as_posix().startswith(root.as_posix().rstrip("/") + "/")


def _readable_roots(base: Path) -> list[Path]:
    """The folder itself, and for a Hugging Face cache snapshot (``models--org--name/snapshots/REV``) the
    repository's ``blobs/``, which the snapshot's file links point to."""
    root = base.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        roots.append(root.parent.parent / "blobs")
    return roots
