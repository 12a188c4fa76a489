"""From the agents' `fr_traces` replies (inside a raw stack capture) to a `Ledger`.

A rank's live trace (asked from the running process) wins over a dump file; a dump file
stands in for a rank that cannot answer (dead, or hook not enabled) when it is not older
than the job's processes. Pure: the raw capture in, the ledger out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_console.core.ledger.analyse import Ledger, build_ledger

if TYPE_CHECKING:  # parsed only when a rank sent a trace (most captures have none)
    from areal_console.core.ledger.trace import RankTrace

NOT_READ = "not in this capture (taken without Flight Recorder traces): stacks only"
ABSENT_HINT = (
    "no Flight Recorder trace from any rank: stacks only "
    "(start the job with the recorder hook on PYTHONPATH, see docs/ledger.md)"
)


def absent_note(ledger: Ledger | None) -> str:
    """The one line shown when a capture has no ledger to show."""
    if ledger is None:
        return NOT_READ
    return ledger.notes[0] if ledger.notes else ABSENT_HINT


def ledger_from_raw(raw: dict[str, Any]) -> Ledger | None:
    """The job's ledger, or None when no node was asked (agents without the op)."""
    live: dict[int, RankTrace] = {}
    files: dict[int, RankTrace] = {}
    notes: list[str] = []
    world = 0
    asked = False
    for node_raw in raw.get("nodes") or []:
        node = str(node_raw.get("node"))
        for p in node_raw.get("processes") or []:
            world = max(world, int(p.get("world_size") or 0))
        fr = node_raw.get("fr")
        if fr is None:
            continue
        asked = True
        if fr.get("error"):
            notes.append(f"{node}: {fr['error']}")
            continue
        for reply in fr.get("live") or []:
            rank = reply.get("rank")
            if rank is None:
                continue
            if reply.get("ok"):
                from areal_console.core.ledger.trace import parse_trace

                trace = parse_trace(
                    int(rank), node, "live", str(reply.get("socket")), reply["trace"]
                )
                live.setdefault(int(rank), trace)
        for f in fr.get("files") or []:
            if f.get("ok"):
                from areal_console.core.ledger.trace import parse_trace

                trace = parse_trace(int(f["rank"]), node, "file", str(f["path"]), f["trace"])
                files.setdefault(int(f["rank"]), trace)
            elif not f.get("stale"):
                notes.append(f"{node}: {f.get('path')}: {f.get('error')}")
    if not asked:
        return None
    traces = dict(files)
    traces.update(live)
    if not traces:
        notes.insert(0, ABSENT_HINT)
    return build_ledger(sorted(traces.values(), key=lambda t: t.rank), world or None, notes)
