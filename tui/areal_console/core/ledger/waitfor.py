"""Who waits for whom across process groups: the wait-for graph of a hung job.

An edge runs from a rank blocked in a collective to each member of that group that has
not reached the same sequence id. A rank is blocked at its last call on a group when some
member is behind it there (or left no trace): a collective completes only when every
member joined, so that call cannot have completed. Torch's own analysis looks at each
group alone; lining the groups up shows deadlocks between them (rank 3 waits in group 1
for rank 2, which waits in group 0 for rank 3) and the rank a chain of waits ends at.

Ranks are linked through their waits (group, sequence id): many ranks waiting in one
collective for the same laggard share one wait, so a 16,384-rank job costs one pass.
Pure: the ledger and what each rank's stack shows in, the graph out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.rankset import format_ranks
from areal_console.core.ledger.analyse import GroupLedger, Ledger

MAX_CYCLES = 32  # cycles named per graph (each rank in a cycle is on one of them)
MAX_EDGES = 4096  # edges listed in JSON; the rest are counted


@dataclass(frozen=True)
class RankActivity:
    """What a rank's stack shows, for ranks the ledger cannot explain."""

    rank: int
    state: str  # "collective" | "compute" | "error" | "gone"
    where: str = ""  # `train_step (x.py:12) -> all_reduce (...)`, or the error


@dataclass(frozen=True)
class Wait:
    """A collective some ranks are blocked in: who waits there and for whom."""

    group: str
    label: str
    seq: int
    op: str
    waiters: tuple[int, ...]
    waits_for: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.op} #{self.seq} of {self.label}"


@dataclass(frozen=True)
class WaitEdge:
    rank: int
    waits_for: int
    group: str
    seq: int
    op: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "waits_for": self.waits_for,
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
        }


@dataclass(frozen=True)
class WaitCycle:
    """`ranks[i]` waits in `groups[i]` (collective `seqs[i]`, `ops[i]`) for `ranks[i+1]`,
    the last for the first."""

    ranks: tuple[int, ...]
    groups: tuple[str, ...]
    seqs: tuple[int, ...]
    ops: tuple[str, ...]
    labels: tuple[str, ...]

    def describe(self) -> str:
        parts = []
        for i, rank in enumerate(self.ranks):
            nxt = self.ranks[(i + 1) % len(self.ranks)]
            parts.append(
                f"rank {rank} waits in {self.ops[i]} #{self.seqs[i]} of {self.labels[i]} "
                f"for rank {nxt}"
            )
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "groups": list(self.groups),
            "seqs": list(self.seqs),
            "ops": list(self.ops),
        }


@dataclass(frozen=True)
class WaitRoot:
    """A rank others wait on (directly or through others) that waits on nobody."""

    rank: int
    why: str
    kind: str  # "dead" | "compute" | "collective" | "unknown"
    waited_by: tuple[int, ...] = ()  # every rank that waits on it, transitively

    def describe(self) -> str:
        return f"rank {self.rank}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "why": self.why}


@dataclass
class WaitForGraph:
    waits: list[Wait]
    cycles: list[WaitCycle] = field(default_factory=list)
    roots: list[WaitRoot] = field(default_factory=list)
    blocked: frozenset[int] = frozenset()  # ranks with a proven wait
    in_cycles: frozenset[int] = frozenset()  # every rank on some cycle

    def edges(self) -> Iterator[WaitEdge]:
        for w in self.waits:
            for rank in w.waiters:
                for other in w.waits_for:
                    yield WaitEdge(rank, other, w.group, w.seq, w.op)

    @property
    def empty(self) -> bool:
        return not self.waits

    def lines(self) -> list[str]:
        """The graph in words: cycles, roots, then the waits (one line each)."""
        out = [f"deadlock: {c.describe()}" for c in self.cycles]
        alike: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        for r in self.roots:
            alike.setdefault((r.why, r.waited_by), []).append(r.rank)
        out += [
            f"root: {_ranks(ranks)} ({why}); waited on by {_ranks(by)}"
            for (why, by), ranks in alike.items()
        ]
        for w in self.waits:
            verb = "waits" if len(w.waiters) == 1 else "wait"
            out.append(f"{_ranks(w.waiters)} {verb} in {w.describe()} for {_ranks(w.waits_for)}")
        return out

    def to_json(self) -> dict[str, Any]:
        edges: list[dict[str, Any]] = []
        total = 0
        for e in self.edges():
            total += 1
            if len(edges) < MAX_EDGES:
                edges.append(e.to_json())
        return {
            "edges": edges,
            "edges_left_off": total - len(edges),
            "cycles": [c.to_json() for c in self.cycles],
            "roots": [r.to_json() for r in self.roots],
        }


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    ranks = sorted(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def group_waits(g: GroupLedger) -> list[Wait]:
    """The collectives of group `g` that cannot have completed, with who waits for whom."""
    heads = {p.rank: p.head for p in g.positions}
    absent = [r for r in g.absent if r not in heads]
    by_head: dict[int, list[int]] = {}
    for rank, head in heads.items():
        if head:
            by_head.setdefault(head, []).append(rank)
    out = []
    for head, waiters in sorted(by_head.items(), reverse=True):
        behind = sorted([r for r, h in heads.items() if h < head] + absent)
        if not behind:
            continue
        call = next((p.call for p in g.positions if p.head == head and p.call), None)
        op = call.op if call is not None else "collective"
        out.append(Wait(g.name, g.label, head, op, tuple(sorted(waiters)), tuple(behind)))
    return out


def build_wait_for(ledger: Ledger, activity: Mapping[int, RankActivity]) -> WaitForGraph:
    """The wait-for graph of `ledger`; `activity` (from the stacks) explains the ranks at
    the end of the waits that the ledger cannot (no trace, not in a collective, gone)."""
    waits = [w for g in ledger.groups for w in group_waits(g)]
    graph = WaitForGraph(waits)
    if not waits:
        return graph
    out: dict[int, list[int]] = {}  # rank -> indices of its waits
    for i, w in enumerate(waits):
        for rank in w.waiters:
            out.setdefault(rank, []).append(i)
    graph.blocked = frozenset(out)
    sccs = _cycles_components(waits, out)
    graph.in_cycles = frozenset(r for comp in sccs for r in comp)
    graph.cycles = _name_cycles(waits, out, sccs)
    graph.roots = _roots(ledger, waits, out, activity)
    return graph


def _successors(waits: list[Wait], out: dict[int, list[int]], rank: int) -> Iterator[int]:
    for i in out.get(rank, ()):
        yield from waits[i].waits_for


def _cycles_components(waits: list[Wait], out: dict[int, list[int]]) -> list[list[int]]:
    """Strongly connected rank sets with a cycle (Tarjan, iterative; ranks linked through
    their shared waits, so each wait's targets are walked once per component pass)."""
    # Nodes: ("r", rank) and ("w", index); rank -> its waits -> their targets.
    index: dict[tuple[str, int], int] = {}
    low: dict[tuple[str, int], int] = {}
    on_stack: set[tuple[str, int]] = set()
    stack: list[tuple[str, int]] = []
    found: list[list[int]] = []

    def succ(node: tuple[str, int]) -> Iterator[tuple[str, int]]:
        kind, n = node
        if kind == "r":
            for i in out.get(n, ()):
                yield ("w", i)
        else:
            for r in waits[n].waits_for:
                yield ("r", r)

    counter = 0
    for start in [("r", r) for r in sorted(out)]:
        if start in index:
            continue
        work: list[tuple[tuple[str, int], Iterator[tuple[str, int]]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, succ(start)))
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, succ(nxt)))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    if top[0] == "r":
                        comp.append(top[1])
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def _shortest_cycle(
    waits: list[Wait], out: dict[int, list[int]], start: int, allowed: set[int]
) -> list[tuple[int, int]] | None:
    """The shortest cycle through `start` inside `allowed`: [(rank, wait index), ...]."""
    prev: dict[int, tuple[int, int]] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        rank = queue.popleft()
        for i in out.get(rank, ()):
            for nxt in waits[i].waits_for:
                if nxt not in allowed:
                    continue
                if nxt == start:
                    path = [(rank, i)]
                    while path[-1][0] != start:
                        path.append(prev[path[-1][0]])
                    return path[::-1]
                if nxt not in seen:
                    seen.add(nxt)
                    prev[nxt] = (rank, i)
                    queue.append(nxt)
    return None


def _name_cycles(
    waits: list[Wait], out: dict[int, list[int]], sccs: list[list[int]]
) -> list[WaitCycle]:
    cycles: list[WaitCycle] = []
    for comp in sccs:
        allowed = set(comp)
        covered: set[int] = set()
        for rank in comp:
            if rank in covered or len(cycles) >= MAX_CYCLES:
                continue
            found = _shortest_cycle(waits, out, rank, allowed)
            if found is None:
                continue
            covered.update(r for r, _ in found)
            turn = min(range(len(found)), key=lambda k: found[k][0])
            path = found[turn:] + found[:turn]  # start at the lowest rank
            cycles.append(
                WaitCycle(
                    ranks=tuple(r for r, _ in path),
                    groups=tuple(waits[i].group for _, i in path),
                    seqs=tuple(waits[i].seq for _, i in path),
                    ops=tuple(waits[i].op for _, i in path),
                    labels=tuple(waits[i].label for _, i in path),
                )
            )
    return cycles


def _waited_by(waits: list[Wait], into: dict[int, list[int]], root: int) -> tuple[int, ...]:
    """Every rank that waits on `root`, directly or through others (`into`: rank -> the
    waits that wait for it; each wait is walked once)."""
    seen: set[int] = set()
    walked: set[int] = set()
    queue = deque([root])
    while queue:
        for i in into.get(queue.popleft(), ()):
            if i in walked:
                continue
            walked.add(i)
            for r in waits[i].waiters:
                if r not in seen and r != root:
                    seen.add(r)
                    queue.append(r)
    return tuple(sorted(seen))


def _roots(
    ledger: Ledger,
    waits: list[Wait],
    out: dict[int, list[int]],
    activity: Mapping[int, RankActivity],
) -> list[WaitRoot]:
    into: dict[int, list[int]] = {}
    for i, w in enumerate(waits):
        for r in w.waits_for:
            into.setdefault(r, []).append(i)
    traced = set(ledger.sources)
    roots = []
    for rank in sorted(r for r in into if r not in out):
        why, kind = _why(rank, ledger, activity.get(rank), rank in traced)
        roots.append(WaitRoot(rank, why, kind, _waited_by(waits, into, rank)))
    return roots


def _last_call(ledger: Ledger, rank: int) -> str:
    """`all_reduce #3 of group 0 (default_pg)`: the rank's furthest recorded call."""
    best = None
    for g in ledger.groups:
        for p in g.positions:
            if p.rank == rank and p.call is not None and (best is None or p.head > best[0]):
                best = (p.head, f"{p.call.op} #{p.head} of {g.label}")
    return best[1] if best else ""


def _why(rank: int, ledger: Ledger, act: RankActivity | None, traced: bool) -> tuple[str, str]:
    last = _last_call(ledger, rank)
    trace_note = f"; its trace ends at {last}" if last else ""
    source = ledger.sources.get(rank, "")
    if act is None or act.state == "gone":
        from_file = " (trace read from its dump file)" if source.startswith("file:") else ""
        return f"dead: no process shows rank {rank}{trace_note}{from_file}", "dead"
    if act.state == "error":
        return f"stack not captured ({act.where}){trace_note}", "unknown"
    if act.state == "compute":
        return f"outside any collective: {act.where}", "compute"
    if not traced:
        return f"no Flight Recorder trace; its stack waits in {act.where}", "collective"
    return (
        f"in {last or 'a collective'}, which every member has reached: it does not "
        f"complete (mismatched calls, or the transport); stack {act.where}",
        "collective",
    )


def waiting_on_cycles(graph: WaitForGraph) -> list[int]:
    """Ranks that wait on a cycle without being on one."""
    if not graph.cycles:
        return []
    return sorted(graph.blocked - graph.in_cycles)
