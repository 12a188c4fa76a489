"""Line the ranks up per process group: who is where, who is behind, where they disagree.

For each group: every member's last enqueued collective (and, where the backend tracks
them, the last started and completed), how many calls each rank is behind the furthest
one, the first sequence id at which ranks recorded different collectives (op, sizes or
dtypes), and the members with no trace at all (dead, or their dump never written).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_console.core.common.rankset import format_ranks

if TYPE_CHECKING:  # at run time only a saved ledger's calls need it (ledger_from_json)
    from areal_console.core.ledger.trace import Call, GroupTrace, RankTrace

DEFAULT_GROUP_DESC = "default_pg"


@dataclass(frozen=True)
class RankPosition:
    """Where one rank is in one group."""

    rank: int
    head: int  # last enqueued collective's sequence id (0: none)
    call: Call | None  # that collective, when still in the rank's buffer
    started: int | None = None
    completed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "enqueued": self.head,
            "started": self.started,
            "completed": self.completed,
            "call": self.call.to_json() if self.call else None,
        }


@dataclass(frozen=True)
class Disagreement:
    """The first collective the group's ranks recorded differently."""

    seq: int
    kind: str  # op | sizes | dtype
    variants: tuple[tuple[Call, tuple[int, ...]], ...]  # (call, ranks), largest first

    def describe(self) -> str:
        parts = [f"{_ranks(r)} {c.describe(seq=False)}" for c, r in self.variants]
        return f"#{self.seq} {self.kind} mismatch: " + " vs ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "variants": [{"ranks": list(r), "call": c.to_json()} for c, r in self.variants],
        }


@dataclass
class GroupLedger:
    """One process group across ranks."""

    name: str
    desc: str
    members: tuple[int, ...]
    positions: list[RankPosition]
    behind: dict[int, int] = field(default_factory=dict)  # rank -> calls behind the furthest
    mismatch: Disagreement | None = None
    absent: tuple[int, ...] = ()  # members with no trace
    members_known: bool = True  # False: the dumps did not say (gloo); members = ranks seen

    @property
    def members_label(self) -> str:
        seen = "" if self.members_known else " (seen; membership not recorded)"
        return f"{_ranks(self.members)}{seen}"

    @property
    def label(self) -> str:
        shown = self.desc if self.desc and self.desc != "undefined" else ""
        return f"group {self.name}" + (f" ({shown})" if shown else "")

    @property
    def healthy(self) -> bool:
        return not (self.behind or self.mismatch or self.absent)

    def summary(self) -> str:
        """`ranks 0-3 all_reduce #17 [8] float32 · rank 4 barrier #17 · rank 5 no trace`."""
        clusters: dict[tuple[int, str], list[int]] = {}
        for p in self.positions:
            what = p.call.describe() if p.call else (f"#{p.head}" if p.head else "no collective")
            clusters.setdefault((-p.head, what), []).append(p.rank)
        parts = [f"{_ranks(r)} {what}" for (_, what), r in sorted(clusters.items())]
        if self.absent:
            parts.append(f"{_ranks(self.absent)} no trace")
        return " · ".join(parts)

    @property
    def used(self) -> bool:
        """Some rank enqueued a collective on it (or something is wrong with it)."""
        return not self.healthy or any(p.head for p in self.positions)

    def problems(self) -> list[str]:
        """What is wrong in this group, one line each (empty when nothing is)."""
        out = []
        if self.mismatch is not None:
            out.append(self.mismatch.describe())
        by_gap: dict[int, list[int]] = {}
        for rank, gap in self.behind.items():
            by_gap.setdefault(gap, []).append(rank)
        for gap, ranks in sorted(by_gap.items()):
            verb = "is" if len(ranks) == 1 else "are"
            out.append(f"{_ranks(ranks)} {verb} {gap} {'call' if gap == 1 else 'calls'} behind")
        if self.absent:
            out.append(f"no trace from {_ranks(self.absent)}")
        return out

    def findings(self) -> list[str]:
        """`problems()`, each prefixed with the group's label."""
        return [f"{self.label}: {p}" for p in self.problems()]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "desc": self.desc,
            "members": list(self.members),
            "members_known": self.members_known,
            "summary": self.summary(),
            "positions": [p.to_json() for p in self.positions],
            "behind": {str(r): n for r, n in sorted(self.behind.items())},
            "mismatch": self.mismatch.to_json() if self.mismatch else None,
            "absent": list(self.absent),
        }


@dataclass
class Ledger:
    """Every process group of the job, plus where each rank's trace came from."""

    groups: list[GroupLedger]
    sources: dict[int, str]  # rank -> "live:<socket>" | "file:<path>"
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # ranks whose trace was not one

    def findings(self) -> list[str]:
        return [f for g in self.groups for f in g.findings()]

    @property
    def used_groups(self) -> list[GroupLedger]:
        return [g for g in self.groups if g.used]

    def group(self, name: str) -> GroupLedger | None:
        return next((g for g in self.groups if g.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": [g.to_json() for g in self.groups],
            "sources": {str(r): s for r, s in sorted(self.sources.items())},
            "notes": list(self.notes),
            "errors": list(self.errors),
            "findings": self.findings(),
        }


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def _members(
    name: str, traces: dict[int, GroupTrace], world: tuple[int, ...]
) -> tuple[tuple[int, ...], bool]:
    """Who belongs, and whether that is known: what the dumps say, else everyone for the
    default group, else (not known) the ranks seen using it."""
    for t in traces.values():
        if t.ranks:
            return t.ranks, True
    if any(t.desc == DEFAULT_GROUP_DESC for t in traces.values()) or name == "0":
        return tuple(sorted(set(world) | set(traces))), bool(world)
    return tuple(sorted(traces)), False


def _first_difference(a: list[Any], b: list[Any]) -> int:
    """Index of the first differing element of two equally long lists (they differ)."""
    lo, hi = 0, len(a)
    while hi - lo > 1:  # bisect on slice equality: compares in C, not item by item
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return lo


def _global_keys(per_rank: dict[int, GroupTrace]) -> dict[int, list[int]]:
    """Each rank's keys renumbered into one table shared by all ranks (ranks that met
    their collectives in the same order, the usual case, keep their list as it is)."""
    ids: dict[str, int] = {}
    out = {}
    for rank, t in per_rank.items():
        local = [ids.setdefault(json.dumps(sig), len(ids)) for sig in t.table]
        same = all(i == g for i, g in enumerate(local))
        out[rank] = t.keys if same else [local[k] for k in t.keys]
    return out


def _first_disagreement(per_rank: dict[int, GroupTrace]) -> int | None:
    """Lowest sequence id at which two ranks' recorded collectives differ."""
    usable = {r: t for r, t in per_rank.items() if t.seqs}
    if len(usable) < 2:
        return None
    keys = _global_keys(usable)
    if all(t.contiguous for t in usable.values()):
        start = max(t.seqs[0] for t in usable.values())
        ref_rank = max(usable, key=lambda r: usable[r].seqs[-1])
        ref, ref_keys = usable[ref_rank], keys[ref_rank]
        first: int | None = None
        for rank, t in usable.items():
            if rank == ref_rank:
                continue
            end = min(t.seqs[-1], ref.seqs[-1])
            if end < start:
                continue
            mine = keys[rank][start - t.seqs[0] : end - t.seqs[0] + 1]
            theirs = ref_keys[start - ref.seqs[0] : end - ref.seqs[0] + 1]
            if mine != theirs:
                seq = start + _first_difference(mine, theirs)
                first = seq if first is None else min(first, seq)
        return first
    # Gaps or repeated ids (coalesced calls): compare by id.
    seen: dict[int, int] = {}
    bad: int | None = None
    for rank, t in usable.items():
        for seq, key in zip(t.seqs, keys[rank], strict=True):
            other = seen.setdefault(seq, key)
            if other != key and (bad is None or seq < bad):
                bad = seq
    return bad


def _disagreement(seq: int, per_rank: dict[int, GroupTrace]) -> Disagreement:
    seen: dict[tuple[object, ...], tuple[Call, list[int]]] = {}
    for rank, t in sorted(per_rank.items()):
        call = t.call_at(seq)
        if call is not None:
            seen.setdefault(call.signature, (call, []))[1].append(rank)
    calls = dict(seen.values())
    variants = sorted(calls.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    ops = {c.op for c in calls}
    kind = "op" if len(ops) > 1 else ("dtype" if len({c.dtypes for c in calls}) > 1 else "sizes")
    if kind == "dtype" and len({(c.input_sizes, c.output_sizes) for c in calls}) > 1:
        kind = "sizes"
    return Disagreement(seq, kind, tuple((c, tuple(r)) for c, r in variants))


def analyse_group(
    name: str, per_rank: dict[int, GroupTrace], world: tuple[int, ...], traced: set[int]
) -> GroupLedger:
    members, known = _members(name, per_rank, world)
    desc = next((t.desc for t in per_rank.values() if t.desc), "")
    positions = []
    for rank in members:
        t = per_rank.get(rank)
        if t is None:
            if rank in traced:  # traced, but never used this group
                positions.append(RankPosition(rank, 0, None))
            continue
        head = t.head
        positions.append(
            RankPosition(rank, head, t.call_at(head), t.last_started, t.last_completed)
        )
    furthest = max((p.head for p in positions), default=0)
    behind = {p.rank: furthest - p.head for p in positions if p.head < furthest}
    seq = _first_disagreement(per_rank)
    mismatch = _disagreement(seq, per_rank) if seq is not None else None
    absent = tuple(r for r in members if r not in traced)
    return GroupLedger(name, desc, members, positions, behind, mismatch, absent, known)


def build_ledger(
    traces: Iterable[RankTrace], world_size: int | None = None, notes: Iterable[str] = ()
) -> Ledger:
    """The ledger of a job from its ranks' traces (one per rank; later ones are ignored)."""
    by_rank: dict[int, RankTrace] = {}
    for t in traces:
        by_rank.setdefault(t.rank, t)
    world = tuple(range(world_size)) if world_size else ()
    per_group: dict[str, dict[int, GroupTrace]] = {}
    for rank, trace in by_rank.items():
        for name, group in trace.groups.items():
            per_group.setdefault(name, {})[rank] = group
    traced = set(by_rank)
    groups = [
        analyse_group(name, per_group[name], world, traced)
        for name in sorted(
            per_group, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)
        )
    ]
    sources = {r: f"{t.source}:{t.where}" for r, t in by_rank.items()}
    return Ledger(groups, sources, list(notes))


def ledger_from_json(doc: dict[str, Any]) -> Ledger:
    """A saved ledger (`Ledger.to_json`) back into records."""
    from areal_console.core.ledger.trace import Call

    groups = []
    for g in doc.get("groups") or []:
        positions = [
            RankPosition(
                rank=int(p["rank"]),
                head=int(p.get("enqueued") or 0),
                call=Call.from_json(p["call"]) if p.get("call") else None,
                started=p.get("started"),
                completed=p.get("completed"),
            )
            for p in g.get("positions") or []
        ]
        mismatch = None
        if g.get("mismatch"):
            m = g["mismatch"]
            variants = tuple(
                (Call.from_json(v["call"]), tuple(int(r) for r in v["ranks"]))
                for v in m.get("variants") or []
            )
            mismatch = Disagreement(int(m["seq"]), str(m["kind"]), variants)
        groups.append(
            GroupLedger(
                name=str(g.get("name")),
                desc=str(g.get("desc") or ""),
                members=tuple(int(r) for r in g.get("members") or []),
                positions=positions,
                behind={int(r): int(n) for r, n in (g.get("behind") or {}).items()},
                mismatch=mismatch,
                absent=tuple(int(r) for r in g.get("absent") or []),
                members_known=bool(g.get("members_known", True)),
            )
        )
    sources = {int(r): str(s) for r, s in (doc.get("sources") or {}).items()}
    notes = [str(n) for n in doc.get("notes") or []]
    return Ledger(groups, sources, notes, [str(e) for e in doc.get("errors") or []])
