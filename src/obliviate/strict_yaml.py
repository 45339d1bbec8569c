"""YAML as yaml.safe_load reads it, except that a key repeated in one mapping (at any depth) is an error.

PyYAML keeps the last of two equal keys without a word, so a recipe with two `method:` sections (or
two `tau:` keys) silently runs something else than the one its author reads first. We compose the
node tree, look for repeated keys with their line numbers, and only then construct the Python data.
"""
from __future__ import annotations

from typing import Any

import yaml

from obliviate.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"


def _where(first: yaml.Mark, second: yaml.Mark) -> str:
    """'lines 3 and 9', or 'columns 2 and 14 of line 1' for a one-line text (an override)."""
    if first.line != second.line:
        return f"lines {first.line + 1} and {second.line + 1}"
    return f"columns {first.column + 1} and {second.column + 1} of line {first.line + 1}"


def check_unique_keys(node: yaml.Node | None, source: str, path: str = "", seen: set[int] | None = None) -> None:
    """Raise ConfigError naming the key path and both positions of the first key repeated in a mapping."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:  # aliases point at nodes already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        marks: dict[str, yaml.Mark] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key_node.tag != MERGE_TAG:
                full = f"{path}.{key}" if path else key
                if key in marks:
                    raise ConfigError(f"{source}: duplicate key {full!r} at {_where(marks[key], key_node.start_mark)} "
                                      "(YAML would silently keep only the last); keep one and merge the two")
                marks[key] = key_node.start_mark
            check_unique_keys(value_node, source, f"{path}.{key}" if path and key else (key or path), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_unique_keys(item, source, f"{path}[{i}]", seen)


def safe_load(text: str, source: str) -> Any:
    """yaml.safe_load(text), but a repeated key is a ConfigError; `source` names the text in messages."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        check_unique_keys(node, source)
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
