"""From the agents' `fr_traces` replies (inside a raw stack capture) to a `Ledger`.

A rank's live trace (asked from the running process) wins over a dump file; a dump file
stands in for a rank that cannot answer (dead, or hook not enabled) when it is not older
than the job's processes. Pure: the raw capture in, the ledger out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_console.core.common.textfmt import printable
from areal_console.core.ledger.analyse import Ledger, build_ledger

if TYPE_CHECKING:  # parsed only when a rank sent a trace (most captures have none)
    from areal_console.core.ledger.trace import RankTrace

NOT_READ = "not in this capture (taken without Flight Recorder traces): stacks only"
ABSENT_HINT = (
    "no Flight Recorder trace from any rank: stacks only "
    "(start the job with the recorder hook on PYTHONPATH, see docs/guide/ledger.md)"
)


def absent_note(ledger: Ledger | None) -> str:
    """The one line shown when a capture has no ledger to show."""
    if ledger is None:
        return NOT_READ
    return ledger.notes[0] if ledger.notes else ABSENT_HINT


def ledger_from_raw(raw: dict[str, Any]) -> Ledger | None:
    """The job's ledger, or None when no node was asked (agents without the op).

    A rank whose trace is not one (a hostile or broken reply, or one the agent already
    marked `"kind": "malformed"`) is named in the ledger's `errors`; the other ranks' traces and the stacks are kept."""
    live: dict[int, RankTrace] = {}
    files: dict[int, RankTrace] = {}
    notes: list[str] = []
    errors: list[str] = []
    world = 0
    asked = False
    for node_raw in raw.get("nodes") or []:
        node = str(node_raw.get("node"))
        for p in node_raw.get("processes") or []:
            world = max(world, int(p.get("world_size") or 0))
        fr = node_raw.get("fr")
        if not isinstance(fr, dict):
            continue
        asked = True
        if fr.get("error"):
            notes.append(f"{node}: {fr['error']}")
            continue
        for reply in fr.get("live") or []:
            rank = reply.get("rank")
            if reply.get("kind") == "malformed":
                errors.append(
                    f"{node}: rank {rank} (pid {reply.get('pid')}): {_text(reply.get('error'))}"
                )
                continue
            if rank is None:
                continue
            if reply.get("ok"):
                where = str(reply.get("socket"))
                trace = _parsed(int(rank), node, "live", where, reply.get("trace"), errors)
                if trace is not None:
                    live.setdefault(int(rank), trace)
        for f in fr.get("files") or []:
            if f.get("ok"):
                where = str(f.get("path"))
                trace = _parsed(int(f["rank"]), node, "file", where, f.get("trace"), errors)
                if trace is not None:
                    files.setdefault(int(f["rank"]), trace)
            elif f.get("kind") == "malformed":
                errors.append(
                    f"{node}: rank {f.get('rank')}: file {_text(f.get('path'))}: {_text(f.get('error'))}"
                )
            elif not f.get("stale"):
                notes.append(f"{node}: {f.get('path')}: {f.get('error')}")
    if not asked:
        return None
    traces = dict(files)
    traces.update(live)
    if not traces:
        notes.insert(0, ABSENT_HINT)
    ledger = build_ledger(sorted(traces.values(), key=lambda t: t.rank), world or None, notes)
    ledger.errors = errors
    return ledger


def _text(value: Any) -> str:
    """A field of an agent's reply, as one printable line of bounded length."""
    return printable(str(value))[:300]


def _parsed(
    rank: int, node: str, source: str, where: str, data: Any, errors: list[str]
) -> RankTrace | None:
    """One rank's trace, or None with a line in `errors` saying why it is not one."""
    from areal_console.core.ledger.trace import TraceError, parse_trace

    try:
        return parse_trace(rank, node, source, where, data)
    except TraceError as exc:
        errors.append(f"{node}: rank {rank}: {source} trace {printable(where)[:200]}: {exc}")
        return None
