"""Merge ranks' main-thread stacks: equivalence classes and a STAT-style prefix tree.

Ranks with identical stacks are grouped first (one dict lookup per rank), so the tree is
built from the few distinct stacks, not from every rank: 16k ranks cost little more than 16.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.rankset import format_ranks as format_ranks
from areal_console.core.common.rankset import parse_ranks as parse_ranks
from areal_console.core.stacks.parsing import gc_paused
from areal_console.core.stacks.records import Frame, RankStack, Stack, StackCapture


@dataclass
class RankGroup:
    """An equivalence class: ranks whose main threads have the same stack."""

    ranks: list[int]
    frames: Stack  # leaf first
    members: list[RankStack] = field(default_factory=list, repr=False)
    outlier: bool = False

    @property
    def label(self) -> str:
        return format_ranks(self.ranks)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def leaf(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "label": self.label,
            "frames": [f.to_json() for f in self.frames],
        }


def group_ranks(ranks: Iterable[RankStack]) -> list[RankGroup]:
    """Ranks (state ok, with a rank number) grouped by main-thread stack, largest first."""
    # By the stack object first: a capture interns its stacks (one tuple per distinct
    # stack), and an id is hashed without walking the frames. Equal stacks that are
    # separate objects (not interned) are then joined by value, among the few groups.
    by_id: dict[int, RankGroup] = {}
    for r in ranks:
        if r.rank is None or r.state != "ok":
            continue
        frames = r.work_frames  # alive as long as `r`: its id stays its own in this loop
        group = by_id.get(id(frames))
        if group is None:
            group = by_id[id(frames)] = RankGroup([], frames)
        group.ranks.append(r.rank)
        group.members.append(r)
    by_stack: dict[Stack, RankGroup] = {}
    for g in by_id.values():
        same = by_stack.get(g.frames)
        if same is None:
            by_stack[g.frames] = g
        else:
            same.ranks += g.ranks
            same.members += g.members
    groups = list(by_stack.values())
    for g in groups:
        g.ranks.sort()
    groups.sort(key=lambda g: (-g.size, g.ranks[0] if g.ranks else 0))
    mark_outliers(groups)
    return groups


def mark_outliers(groups: list[RankGroup]) -> None:
    """Small classes next to a clearly larger one: the ranks worth looking at first."""
    if len(groups) < 2:
        return
    total = sum(g.size for g in groups)
    largest = groups[0].size
    threshold = max(1, total // 8)
    for g in groups[1:]:
        g.outlier = g.size < largest and g.size <= threshold


@dataclass
class TreeNode:
    """A frame in the merged tree, with the ranks whose stacks pass through it."""

    frame: Frame | None  # None at the root
    depth: int
    ranks: list[int] = field(default_factory=list)
    children: dict[Frame, TreeNode] = field(default_factory=dict)
    groups: list[int] = field(default_factory=list)  # indexes of groups ending here

    @property
    def label(self) -> str:
        return format_ranks(self.ranks)

    def walk(self) -> Iterable[TreeNode]:
        """Depth-first, children in order of rank count (largest first)."""
        stack: list[TreeNode] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(
                sorted(node.children.values(), key=lambda c: (len(c.ranks), -min(c.ranks)))
            )


def build_tree(groups: list[RankGroup]) -> TreeNode:
    root = TreeNode(None, 0)
    for index, g in enumerate(groups):
        root.ranks.extend(g.ranks)
        node = root
        for depth, frame in enumerate(reversed(g.frames), start=1):
            child = node.children.get(frame)
            if child is None:
                child = node.children[frame] = TreeNode(frame, depth)
            child.ranks.extend(g.ranks)
            node = child
        node.groups.append(index)
    for node in root.walk():
        node.ranks.sort()
    return root


def thread_trees(capture: StackCapture, include_idle: bool) -> dict[str, TreeNode]:
    """Every thread of every rank, one merged tree per thread name (work threads first)."""
    by_name: dict[str, dict[Stack, RankGroup]] = {}
    main_names: set[str] = set()
    for r in capture.ranks:
        if r.rank is None or r.state != "ok":
            continue
        work = r.work_thread
        for t in r.threads:
            if t.idle and not include_idle and t is not work:
                continue
            if t is work:
                main_names.add(t.name)
            groups = by_name.setdefault(t.name, {})
            group = groups.get(t.frames)
            if group is None:
                group = groups[t.frames] = RankGroup([], t.frames)
            group.ranks.append(r.rank)
    order = sorted(by_name, key=lambda n: (n not in main_names, n))
    out: dict[str, TreeNode] = {}
    for name in order:
        ordered = sorted(by_name[name].values(), key=lambda g: (-g.size, min(g.ranks)))
        out[name] = build_tree(ordered)
    return out


def common_prefix(groups: list[RankGroup]) -> Stack:
    """Frames shared from the root by every group (root first)."""
    if not groups:
        return ()
    rooted = [tuple(reversed(g.frames)) for g in groups]
    shortest = min(len(s) for s in rooted)
    out: list[Frame] = []
    for i in range(shortest):
        frame = rooted[0][i]
        if any(s[i] != frame for s in rooted[1:]):
            break
        out.append(frame)
    return tuple(out)


@dataclass
class StackAnalysis:
    """Everything derived from a capture that the views and the diagnosis need."""

    capture: StackCapture
    groups: list[RankGroup]
    tree: TreeNode
    shared: Stack  # root first: frames every rank shares
    world_size: int | None
    missing: list[int]
    _group_index: dict[int, int] | None = field(default=None, repr=False)

    @property
    def divergence(self) -> Frame | None:
        """Where the ranks part ways: the deepest function every rank is in.

        That is the frame after the shared prefix when all ranks are in the same function
        there on different lines (a loop body vs. its `finally`), else the last shared one.
        """
        if len(self.groups) < 2:
            return None
        depth = len(self.shared)
        nxt = [g.frames[-1 - depth] for g in self.groups if len(g.frames) > depth]
        if len(nxt) == len(self.groups) and all(
            (f.function, f.file) == (nxt[0].function, nxt[0].file) for f in nxt
        ):
            return nxt[0]
        return self.shared[-1] if self.shared else None

    @property
    def outliers(self) -> list[RankGroup]:
        return [g for g in self.groups if g.outlier]

    def group_of(self, rank: int) -> int | None:
        """Index of the group holding `rank` (None for missing or failed ranks)."""
        if self._group_index is None:
            self._group_index = {r: i for i, g in enumerate(self.groups) for r in g.ranks}
        return self._group_index.get(rank)


def expected_world_size(ranks: Iterable[RankStack]) -> int | None:
    sizes = [r.world_size for r in ranks if r.world_size]
    return max(sizes) if sizes else None


def missing_ranks(ranks: list[RankStack], world_size: int | None) -> list[int]:
    """Ranks `WORLD_SIZE` promises that no node shows (any state counts as shown)."""
    if not world_size:
        return []
    seen = {r.rank for r in ranks if r.rank is not None}
    return [r for r in range(world_size) if r not in seen]


def analyse(capture: StackCapture) -> StackAnalysis:
    with gc_paused():
        groups = group_ranks(capture.ranks)
        world = expected_world_size(capture.ranks)
        return StackAnalysis(
            capture=capture,
            groups=groups,
            tree=build_tree(groups),
            shared=common_prefix(groups),
            world_size=world,
            missing=missing_ranks(capture.ranks, world),
        )


def group_name(index: int) -> str:
    """Groups are lettered (A, B, ..., Z, AA, ...) so they are never read as ranks, which
    are numbered from 0."""
    name = ""
    index += 1
    while index:
        index, left = divmod(index - 1, 26)
        name = chr(ord("A") + left) + name
    return name
