"""Side-by-side diff of two stacks, aligned frame by frame from the root."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_console.core.stacks.records import Frame, Stack


@dataclass(frozen=True)
class DiffRow:
    """One aligned position. `kind`: same | line (same function, other line) | differ."""

    left: Frame | None
    right: Frame | None
    kind: str

    @property
    def same(self) -> bool:
        return self.kind == "same"


@dataclass
class StackDiff:
    rows: list[DiffRow]  # root first
    first_difference: int | None  # index into rows; None when the stacks are equal

    @property
    def differences(self) -> list[int]:
        """Row indexes where the two sides differ (for next/previous difference)."""
        return [i for i, r in enumerate(self.rows) if not r.same]

    @property
    def equal(self) -> bool:
        return self.first_difference is None

    def to_json(self) -> dict[str, Any]:
        return {
            "first_difference": self.first_difference,
            "rows": [
                {
                    "left": r.left.to_json() if r.left else None,
                    "right": r.right.to_json() if r.right else None,
                    "kind": r.kind,
                }
                for r in self.rows
            ],
        }


def _kind(a: Frame | None, b: Frame | None) -> str:
    if a is None or b is None:
        return "differ"
    if a == b:
        return "same"
    if a.function == b.function and a.file == b.file:
        return "line"
    return "differ"


def diff_stacks(left: Stack, right: Stack) -> StackDiff:
    """Align two leaf-first stacks from the root; mark the first differing frame."""
    a = list(reversed(left))
    b = list(reversed(right))
    rows: list[DiffRow] = []
    first: int | None = None
    for i in range(max(len(a), len(b))):
        fa = a[i] if i < len(a) else None
        fb = b[i] if i < len(b) else None
        kind = _kind(fa, fb)
        if kind != "same" and first is None:
            first = i
        rows.append(DiffRow(fa, fb, kind))
    return StackDiff(rows, first)


@dataclass
class RankChange:
    """How one rank's main-thread stack differs between two captures."""

    rank: int
    status: str  # changed | same | appeared | vanished
    diff: StackDiff | None


def compare_captures(before: Any, after: Any) -> list[RankChange]:
    """Rank by rank, main-thread stacks of two `StackCapture`s (before/after a change)."""
    left = {r.rank: r for r in before.rank_stacks if r.state == "ok"}
    right = {r.rank: r for r in after.rank_stacks if r.state == "ok"}
    out: list[RankChange] = []
    for rank in sorted(set(left) | set(right)):
        a, b = left.get(rank), right.get(rank)
        if a is None:
            out.append(RankChange(rank, "appeared", None))
        elif b is None:
            out.append(RankChange(rank, "vanished", None))
        else:
            d = diff_stacks(a.work_frames, b.work_frames)
            out.append(RankChange(rank, "same" if d.equal else "changed", d))
    return out
