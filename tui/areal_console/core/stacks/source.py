"""A few lines of source around a frame's line, when the file is on this machine."""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass


@dataclass
class SourceSnippet:
    path: str
    line: int
    first: int  # number of the first line in `lines`
    lines: list[str]
    error: str | None = None


def read_snippet(path: str, line: int, context: int = 8) -> SourceSnippet:
    """Lines `line - context .. line + context` of `path`; an error string if unreadable."""
    if not path or path.startswith("<"):
        return SourceSnippet(path, line, line, [], f"{path or 'this frame'} has no source file")
    if not os.path.isfile(path):
        return SourceSnippet(
            path,
            line,
            line,
            [],
            f"{path} is not on this machine (the rank runs on another node?)",
        )
    linecache.checkcache(path)
    lines = linecache.getlines(path)
    if not lines:
        return SourceSnippet(path, line, line, [], f"cannot read {path}")
    first = max(1, line - context)
    last = min(len(lines), line + context)
    return SourceSnippet(path, line, first, [s.rstrip("\n") for s in lines[first - 1 : last]])
