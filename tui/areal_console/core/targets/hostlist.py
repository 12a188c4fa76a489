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


# One bracket's numbers: (the low end as written, first, last); a plain number is a range
# of one. Kept as ranges, so a list is counted before any name is built.
Range = tuple[str, int, int]


def _ranges(expr: str, body: str) -> list[Range]:
    """`01-03,7` -> [("01", 1, 3), ("7", 7, 7)]."""
    out: list[Range] = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not _NUMBER.fullmatch(lo) or (dash and not _NUMBER.fullmatch(hi)):
            raise _bad(expr, f"{part!r} is not a number or a range of numbers")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise _bad(expr, f"range {part!r} runs backwards")
        out.append((lo, first, last))
    return out


def _parse_item(expr: str) -> tuple[list[str], list[list[Range]]]:
    """An item's literal texts and its brackets: `a[1-2]b` -> (["a", "b"], [[("1", 1, 2)]])."""
    literals: list[str] = []
    groups: list[list[Range]] = []
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
        groups.append(_ranges(expr, rest[start + 1 : end]))
        rest = rest[end + 1 :]
    return literals, groups


def _count(groups: list[list[Range]]) -> int:
    """How many names the brackets multiply out to, stopping once past MAX_HOSTS."""
    total = 1
    for group in groups:
        total *= sum(last - first + 1 for _, first, last in group)
        if total > MAX_HOSTS:
            return MAX_HOSTS + 1
    return total


def _values(group: list[Range]) -> list[str]:
    return [str(i).zfill(len(lo)) for lo, first, last in group for i in range(first, last + 1)]


def _build(literals: list[str], groups: list[list[Range]]) -> list[str]:
    if not groups:
        return [literals[0]]
    # Slurm's order: each bracket with text after it varies slower than the names before
    # it; the last bracket varies fastest.
    names = [literals[0]]
    for group, after in zip(groups[:-1], literals[1:-1], strict=True):
        names = [name + v + after for v in _values(group) for name in names]
    return [name + v + literals[-1] for name in names for v in _values(groups[-1])]


def _too_many(expr: str) -> UserError:
    return _bad(expr, f"more than {MAX_HOSTS:,} hosts (not expanded)")


def hostlist_size(expr: str) -> int:
    """How many names `expr` expands to, counted without building them; past MAX_HOSTS
    it is refused (`UserError`), as `expand_hostlist` refuses it."""
    total = 0
    for item in split_hostlist(expr):
        total += _count(_parse_item(item)[1])
        if total > MAX_HOSTS:
            raise _too_many(expr)
    return total


def expand_hostlist(expr: str) -> list[str]:
    """Every host name of a Slurm hostlist expression, in Slurm's order. The names are
    counted first: `a[0-65535]b[0-65535]` (4.3e9 names) is refused before one is built."""
    items = [_parse_item(item) for item in split_hostlist(expr)]
    total = 0
    for _, groups in items:
        total += _count(groups)
        if total > MAX_HOSTS:
            raise _too_many(expr)
    return [name for literals, groups in items for name in _build(literals, groups)]
