"""YAML files the console reads (inventory, settings), with limits a hostile file can't pass.

PyYAML's safe loader builds no objects, but aliases still multiply: nine anchors of nine
aliases each ("billion laughs") expand to 10^9 nodes and gigabytes of memory. Here a
document is composed first (aliases stay shared references), its expanded size is counted
without expanding it, and only a document under `MAX_NODES` is constructed. Files over
`MAX_BYTES` are refused before parsing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from areal_console.core.common.errors import UserError

MAX_BYTES = 1 << 20  # an inventory of thousands of nodes is well under this
MAX_NODES = 100_000  # scalars, lists and mappings after every alias is expanded


def read_text(path: Path, what: str) -> str:
    """The file's text, refused when it is larger than `MAX_BYTES` (or not a file)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory, not a file") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{what} {path} is larger than {MAX_BYTES >> 20} MiB: refusing to read it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"cannot read {what} {path}: not UTF-8 text ({exc.reason})") from None


def expanded_size(node: yaml.Node, limit: int = MAX_NODES) -> int:
    """How many nodes `node` has once every alias is expanded (stops counting past `limit`).

    Shared subtrees are counted once per use, from a memo, so this costs one visit per
    distinct node however large the expansion. A recursive alias raises `ValueError`."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise ValueError("a recursive alias (an anchor used inside itself)")
        busy.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > limit:
                    break
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        busy.discard(key)
        sizes[key] = total
        return total

    return size(node)


def load(text: str, loader_class: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """Parse `text` with `loader_class` (a SafeLoader), refusing alias bombs.

    Raises `yaml.YAMLError` for bad YAML and `ValueError` for a document that expands
    past `MAX_NODES` nodes or holds a recursive alias."""
    loader = loader_class(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ValueError("the document is nested too deeply") from None
        if node is None:
            return None
        try:
            size = expanded_size(node)
        except RecursionError:
            raise ValueError("the document is nested too deeply") from None
        if size > MAX_NODES:
            raise ValueError(
                f"the document expands to more than {MAX_NODES:,} values (aliases repeating "
                "anchors many times over): refusing it"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()
