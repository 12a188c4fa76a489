"""Slurm's hostlist grammar (`n[01-03,7],gpu[1-2]x[1-4]`), as `scontrol show hostnames` reads it.

- A list is split at commas outside brackets; empty items are dropped (`a,,b`).
- A bracket holds numbers and ranges (`1-3,7`); a range keeps the width of its low end,
  so `[008-010]` gives 008 009 010 and `[8-10]` gives 8 9 10; duplicates are kept.
- Several brackets multiply out in Slurm's own order: the last bracket varies fastest,
  then the first, the second, ... (`a[1-2]b[3-4]c[5-6]` -> a1b3c5 a1b3c6 a2b3c5 ...).
- One extension: text after the last bracket (`gpu[1-2].example.org`) is appended to every
  name; scontrol refuses it, and DNS names need it.

Mistakes raise `UserError` naming the expression; an expansion is capped at
`MAX_HOSTS` names, like Slurm's own "too many hosts".
"""

from __future__ import annotations

import re

from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import clip_repr

MAX_HOSTS = 65536
_NUMBER = re.compile(r"\d+")


def split_hostlist(expr: str) -> list[str]:
    """Split at top-level commas: `a[1-2,5],b` -> [`a[1-2,5]`, `b`] (empty items dropped)."""
    parts: list[str] = []
    depth, current = 0, list[str]()
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p]


def _bad(expr: str, why: str) -> UserError:
    return UserError(f"bad host list {clip_repr(expr)}: {why}")


def _values(expr: str, body: str) -> list[str]:
    """`01-03,7` -> ["01", "02", "03", "7"]."""
    out: list[str] = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not _NUMBER.fullmatch(lo) or (dash and not _NUMBER.fullmatch(hi)):
            raise _bad(expr, f"{part!r} is not a number or a range of numbers")
        if not dash:
            out.append(lo)
            continue
        first, last = int(lo), int(hi)
        if last < first:
            raise _bad(expr, f"range {part!r} runs backwards")
        if last - first + 1 + len(out) > MAX_HOSTS:
            raise _bad(expr, f"more than {MAX_HOSTS} hosts")
        out.extend(str(i).zfill(len(lo)) for i in range(first, last + 1))
    return out


def _expand_item(expr: str) -> list[str]:
    literals: list[str] = []
    groups: list[list[str]] = []
    rest = expr
    while True:
        start = rest.find("[")
        if start < 0:
            if "]" in rest:
                raise _bad(expr, "']' without '['")
            literals.append(rest)
            break
        end = rest.find("]", start)
        if end < 0 or "[" in rest[start + 1 : end]:
            raise _bad(expr, "'[' without a matching ']'")
        if "]" in rest[:start]:
            raise _bad(expr, "']' without '['")
        literals.append(rest[:start])
        groups.append(_values(expr, rest[start + 1 : end]))
        rest = rest[end + 1 :]
    if not groups:
        return [expr]
    # Slurm's order: each bracket with text after it varies slower than the names before
    # it; the last bracket varies fastest.
    names = [literals[0]]
    for values, after in zip(groups[:-1], literals[1:-1], strict=True):
        names = [name + v + after for v in values for name in names]
        if len(names) > MAX_HOSTS:
            raise _bad(expr, f"more than {MAX_HOSTS} hosts")
    out = [name + v + literals[-1] for name in names for v in groups[-1]]
    if len(out) > MAX_HOSTS:
        raise _bad(expr, f"more than {MAX_HOSTS} hosts")
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Every host name of a Slurm hostlist expression, in Slurm's order."""
    out: list[str] = []
    for item in split_hostlist(expr):
        out.extend(_expand_item(item))
        if len(out) > MAX_HOSTS:
            raise _bad(expr, f"more than {MAX_HOSTS} hosts")
    return out
