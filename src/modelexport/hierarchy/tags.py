"""The tag format and helpers shared by every command that reads tags.

A tag is ``/Seg/Seg.N/...``: class names from the root module down, with an instance suffix
(``BertLayer.0``) taken from the attribute name in the parent when that is an index, or when
siblings of the same class must be told apart.
"""

from __future__ import annotations

import re

import onnx

from ..errors import InvalidModelError

__all__ = [
    "MAX_TAG_CHARS",
    "MAX_TAG_DEPTH",
    "node_props",
    "node_tag",
    "NAMESPACE_KEY",
    "TAG_KEY",
    "TAG_SOURCE_KEY",
    "TAG_PATTERN",
    "common_ancestor",
    "is_within",
    "parse_tag",
    "read_node_tags",
    "node_key",
    "set_node_tag",
    "set_props",
    "portable_stack_trace",
]

TAG_KEY = "modelexport.hierarchy_tag"
TAG_SOURCE_KEY = "modelexport.tag_source"  # "scope" | "propagated" | "inherited" (added by a transform)
#: Read by Model Explorer's ONNX adapter to group nodes into layers: our tag's levels, without the leading slash.
NAMESPACE_KEY = "namespace"
_SEGMENT = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*"
TAG_PATTERN = re.compile(rf"^(?:/{_SEGMENT})+$")
#: Bounds on a tag read from a file. Real module trees are a few to a few dozen levels deep; a tag past these
#: was written outside modelexport, and refusing it keeps every command on tags linear in the model's size.
MAX_TAG_DEPTH = 256
MAX_TAG_CHARS = 16_384


def parse_tag(tag: str) -> list[str]:
    """Split a tag into its segments; raises ValueError for a malformed tag."""
    if not isinstance(tag, str) or not TAG_PATTERN.match(tag):
        raise ValueError(f"malformed hierarchy tag {tag!r}; expected '/Root/Child.0/...'")
    return tag[1:].split("/")


def is_within(tag: str, ancestor: str) -> bool:
    """True if ``tag`` is ``ancestor`` or below it."""
    return tag == ancestor or tag.startswith(ancestor.rstrip("/") + "/")


def common_ancestor(tags: list[str] | set[str]) -> str | None:
    """The deepest tag that contains all ``tags`` (segment-wise common prefix)."""
    tags = [t for t in tags if t]
    if not tags:
        return None
    split = [t[1:].split("/") for t in tags]
    prefix: list[str] = []
    for parts in zip(*split, strict=False):
        if all(p == parts[0] for p in parts):
            prefix.append(parts[0])
        else:
            break
    return "/" + "/".join(prefix) if prefix else None


def node_key(node: onnx.NodeProto, index: int) -> str:
    """A stable key for a node: its name, or ``op_type#index`` for unnamed nodes."""
    return node.name or f"{node.op_type}#{index}"


def node_props(node: onnx.NodeProto) -> dict[str, str]:
    """A node's ``metadata_props`` as a dict (its tag, tag source, name scopes...)."""
    return {p.key: p.value for p in node.metadata_props}


def node_tag(node: onnx.NodeProto, index: int | None = None) -> str | None:
    """``node``'s hierarchy tag (None when it has none), refused past :data:`MAX_TAG_DEPTH` levels or
    :data:`MAX_TAG_CHARS` characters (``index``: the node's position, for the message)."""
    tag = next((p.value for p in node.metadata_props if p.key == TAG_KEY), None) or None
    if tag is not None and (len(tag) > MAX_TAG_CHARS or tag.count("/") > MAX_TAG_DEPTH):
        where = node_key(node, index) if index is not None else node.name or node.op_type
        raise InvalidModelError(
            f"node {where[:80]!r} has a hierarchy tag of {tag.count('/'):,} levels and {len(tag):,} characters"
            f" (at most {MAX_TAG_DEPTH} levels and {MAX_TAG_CHARS:,} characters)",
            hint="the tag was written outside modelexport: re-export the model",
        )
    return tag


def read_node_tags(model: onnx.ModelProto) -> dict[str, dict[str, str | None]]:
    """Node key -> {tag, source, op_type} for the main graph, read from node metadata."""
    out: dict[str, dict[str, str | None]] = {}
    for i, node in enumerate(model.graph.node):
        props = node_props(node)
        out[node_key(node, i)] = {
            "tag": node_tag(node, i),
            "source": props.get(TAG_SOURCE_KEY),
            "op_type": node.op_type,
        }
    return out


def set_props(holder: onnx.NodeProto | onnx.ModelProto, updates: dict[str, str]) -> None:
    """Set (or replace) entries of ``holder.metadata_props`` (a NodeProto or a ModelProto), keeping the others.

    Setting a node's tag also sets its ``namespace`` (the tag without the leading slash), so every pass that
    tags or re-tags nodes leaves a model that Model Explorer shows with our hierarchy as collapsible layers
    (the dynamo exporter's own namespace value is replaced; ORT's quantizer and fusions drop it).
    """
    wanted = dict(updates)
    if updates.get(TAG_KEY):
        wanted.setdefault(NAMESPACE_KEY, updates[TAG_KEY].lstrip("/"))
    for prop in holder.metadata_props:
        if prop.key in wanted:
            prop.value = wanted.pop(prop.key)
    for key, value in wanted.items():
        entry = holder.metadata_props.add()
        entry.key, entry.value = key, value


def set_node_tag(node: onnx.NodeProto, tag: str, source: str | None = None) -> None:
    """Set (or replace) a node's tag entries in its ``metadata_props``."""
    set_props(node, {TAG_KEY: tag} if source is None else {TAG_KEY: tag, TAG_SOURCE_KEY: source})


#: The dynamo exporter's per-node Python stack (``File "/abs/path/...py", line N, in f``): useful, but the
#: absolute paths are the exporting machine's (its venv, its home folder) and do not belong in a package.
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
_FILE = re.compile(r'File "([^"]+)"')
_INSTALLED = re.compile(r".*[/\\](?:site|dist)-packages[/\\]")
_SEPARATORS = re.compile(r"[/\\]")


def _portable_path(match: re.Match[str]) -> str:
    path = match.group(1)
    if _INSTALLED.match(path):
        return f'File "{_INSTALLED.sub("", path)}"'  # transformers/models/bert/modeling_bert.py
    if path.startswith(("/", "\\")) or ":" in path[:3]:  # another absolute path: the file's name
        return f'File "{_SEPARATORS.split(path)[-1]}"'
    return match.group(0)


def portable_stack_trace(node: onnx.NodeProto) -> None:
    """Keep the node's stack trace, without the exporting machine's paths: an installed package's file
    relative to its ``site-packages``, any other absolute file by its name."""
    for prop in node.metadata_props:
        if prop.key == STACK_TRACE_KEY:
            prop.value = _FILE.sub(_portable_path, prop.value)
