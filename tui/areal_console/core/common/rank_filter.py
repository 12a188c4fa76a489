"""The `/` filter of the screens that list ranks (Stacks groups, Cluster processes and
nodes), read once: a rank set (`0-2047,2049-4095`), `node:NAME`, `role:ROLE`, or text.

A leaf module: no screen imports another for it, and a rank set is never expanded
(`0-999999999` is one interval, not a billion ranks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANK_SET = re.compile(r"^\d{1,9}(-\d{1,9})?(,\d{1,9}(-\d{1,9})?){0,63}$")


def rank_intervals(text: str) -> list[tuple[int, int]] | None:
    """`0-2047,4095` as intervals [(0, 2047), (4095, 4095)]; None when `text` is no rank
    set (spaces are ignored; at most 64 parts, 9 digits a number)."""
    text = text.replace(" ", "")
    if not _RANK_SET.match(text):
        return None
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


@dataclass(frozen=True)
class RankFilter:
    """One filter as typed. Exactly one of `ranks`, `node`, `role` is set, or none (then
    `text` is searched as text; empty: everything passes)."""

    text: str  # stripped, lower case
    ranks: tuple[tuple[int, int], ...] | None = None
    node: str | None = None  # a part of the node's name, lower case
    role: str | None = None  # a part of the role, lower case

    @property
    def structured(self) -> bool:
        """A rank set, `node:` or `role:` (not text to search command lines for)."""
        return self.ranks is not None or self.node is not None or self.role is not None

    def has_rank(self, rank: int | None) -> bool:
        """Whether `rank` is in the rank set (a filter without one: always)."""
        if self.ranks is None:
            return True
        return rank is not None and any(lo <= rank <= hi for lo, hi in self.ranks)

    @property
    def number(self) -> int | None:
        """The one number typed (`4103`), which screens listing processes also take as a
        pid (the palette's jump to a rank filters by its pid); None for any other filter."""
        if self.ranks is None or len(self.ranks) != 1 or not self.text.isdigit():
            return None
        return self.ranks[0][0]

    def has_node(self, node: str) -> bool:
        return self.node is None or self.node in node.lower()

    def has_role(self, role: str | None) -> bool:
        return self.role is None or self.role in (role or "").lower()


def parse_filter(text: str) -> RankFilter:
    """`text` as the screens read it: a rank set, `node:NAME`, `role:ROLE` (a key with
    nothing after its colon is text), else text."""
    needle = text.strip().lower()
    intervals = rank_intervals(needle) if needle else None
    if intervals is not None:
        return RankFilter(needle, ranks=tuple(intervals))
    key, colon, value = needle.partition(":")
    value = value.strip()
    if colon and value and key.strip() == "node":
        return RankFilter(needle, node=value)
    if colon and value and key.strip() == "role":
        return RankFilter(needle, role=value)
    return RankFilter(needle)
