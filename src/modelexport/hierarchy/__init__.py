"""Module hierarchy: the module tree, tag rules, scope extraction per exporter, tagging and propagation."""

from .tagger import TaggingResult, tag_model
from .tags import TAG_KEY, TAG_SOURCE_KEY, common_ancestor, is_within, parse_tag, read_node_tags
from .tree import ModuleInfo, ModuleTree, TagRules

__all__ = [
    "TAG_KEY",
    "TAG_SOURCE_KEY",
    "ModuleInfo",
    "ModuleTree",
    "TagRules",
    "TaggingResult",
    "common_ancestor",
    "is_within",
    "parse_tag",
    "read_node_tags",
    "tag_model",
]
