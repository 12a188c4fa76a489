"""Rank sets as compact ranges (STAT style): [0, 1, 2, 3, 8] <-> "0-3,8".

A leaf module: the stack merge, the collective ledger and the screens all print rank sets,
and none of them should import another just for this.
"""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank ranges: [0, 1, 2, 3, 8] -> "0-3,8"."""
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for r in ordered[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def brief_ranks(ranks: Iterable[int], width: int = 64) -> str:
    """`format_ranks`, cut to about `width` characters at a range boundary when longer,
    with how many ranks it holds: a diagnosis names 2,048 scattered outliers in one line
    ("0,2,4,...,30,... (2048 ranks in 2048 ranges)"), the full set stays in the groups."""
    ordered = sorted(set(ranks))
    full = format_ranks(ordered)
    if len(full) <= width:
        return full
    parts = full.split(",")
    kept: list[str] = []
    for part in parts:
        if len(",".join([*kept, part])) > width - 4 and kept:
            break
        kept.append(part)
    return f"{','.join(kept)},... ({len(ordered)} ranks in {len(parts)} ranges)"


def parse_ranks(text: str) -> list[int]:
    """The inverse of `format_ranks`: "0-3,8" -> [0, 1, 2, 3, 8]."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad rank range {part!r} (expected e.g. 0-3,8)")
        out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(out)
