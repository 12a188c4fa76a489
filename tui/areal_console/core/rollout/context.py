"""What a stack capture learns about the rollout side from the job's own files.

During a capture each node's agent is asked (`file_tail`, bounded) for the files AReaL
writes under the job's log directory `<fileroot>/logs/<user>/<experiment>/<trial>`:
each rank's perf tracer file (`perf_tracer[/<role>]/traces-r{rank}.jsonl`, its last
MiB) and the tail of the rollout and controller logs (the executor's tracing lines).
`apply_rollout` turns them into `ranks[].phase` and the capture's `rollout` summary: the
staleness capacity recomputed, with its zero term named.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_node.constants import config_key

from areal_console.core.metrics.logdir import log_dir_from_processes
from areal_console.core.rollout.perf_trace import MAX_TAIL, RankPhase, phases, progress
from areal_console.core.rollout.staleness import Capacity, RolloutCounts, capacity, last_counts

if TYPE_CHECKING:
    from areal_console.core.connection.fleet import NodeSession
    from areal_console.core.stacks.records import StackCapture

LOG_TAIL = 256 << 10  # bytes of each log read for tracing lines
LOGS = ("rollout.log", "main.log", "trainer.log")
MAX_RANK_FILES = 256  # trace files read per node
# AReaL's defaults (areal/api/cli_args.py:2487-2509 at cbff54d): max_concurrent_rollouts
# None (= consumer_batch_size), consumer_batch_size 1, max_head_offpolicyness 0.
DEFAULTS = {
    "rollout.max_head_offpolicyness": 0,
    "rollout.consumer_batch_size": 1,
    "rollout.max_concurrent_rollouts": None,
}
TRACER_OFF = (
    "No perf tracer files: turn AReaL's tracer on to see where each rank is in its step: "
    f"`{config_key('perf_tracer.enabled')}=true` (session traces: "
    f"`{config_key('perf_tracer.session_tracer.enabled')}=true`)"
)
TRACING_OFF = (
    f"No rollout tracing lines: `{config_key('rollout.enable_rollout_tracing')}=true` logs the "
    "executor's running/accepted counts, from which the staleness capacity is recomputed"
)


@dataclass
class RolloutSummary:
    """The capture's view of rollout: capacity (when counts were found) and notes."""

    counts: RolloutCounts | None = None
    capacity: Capacity | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the values used, and where from
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        cap = self.capacity
        return {
            "counts": None
            if self.counts is None
            else {
                "enqueued": self.counts.enqueued,
                "running": self.counts.running,
                "accepted": self.counts.accepted,
                "rejected": self.counts.rejected,
                "source": self.counts.source,
            },
            "capacity": None
            if cap is None
            else {
                "concurrency": cap.concurrency,
                "staleness": cap.staleness,
                "capacity": cap.capacity,
                "zero_terms": list(cap.zero_terms),
                "explanation": cap.explanation,
            },
            "config": dict(self.config),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, doc: Any) -> RolloutSummary | None:
        """A saved capture's `rollout` (its capacity recomputed from counts and config)."""
        if not isinstance(doc, dict):
            return None
        out = cls(notes=[str(n)[:500] for n in (doc.get("notes") or [])[:8] if isinstance(n, str)])
        counts, config = doc.get("counts"), doc.get("config")
        if not isinstance(counts, dict) or not isinstance(config, dict):
            return out
        try:
            e, r, a, j = (int(counts[k]) for k in ("enqueued", "running", "accepted", "rejected"))
            out.counts = RolloutCounts(e, r, a, j, str(counts.get("source") or "")[:500])
            values = {k: config[k]["value"] for k in (*DEFAULTS, "version")}
            out.config = {
                k: {"value": v, "from": str(config[k].get("from"))} for k, v in values.items()
            }
            out.capacity = capacity(
                out.counts,
                int(values["version"]),
                int(values["rollout.max_head_offpolicyness"]),
                int(values["rollout.consumer_batch_size"]),
                None
                if values["rollout.max_concurrent_rollouts"] is None
                else int(values["rollout.max_concurrent_rollouts"]),
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            out.counts = out.capacity = None
        return out


def _decode(reply: dict[str, Any]) -> str:
    data = reply.get("data")
    if not isinstance(data, str):
        return ""
    try:
        raw = zlib.decompressobj().decompress(base64.b64decode(data), MAX_TAIL + 1)
    except (ValueError, zlib.error):
        return ""
    return raw.decode("utf-8", "replace")


def _tail(session: NodeSession, path: str, limit: int) -> dict[str, Any] | None:
    """The last `limit` bytes of a file on the node (None: absent or unreadable)."""
    try:
        head = session.call("file_tail", {"path": path, "offset": 0, "max_bytes": 1}, timeout=10)
        size = int(head.get("size") or 0)
        reply = head
        if size > 1:
            offset = max(0, size - limit)
            reply = session.call(
                "file_tail",
                {"path": path, "offset": offset, "ident": head.get("ident"), "max_bytes": limit},
                timeout=20,
            )
    except Exception:  # absent, refused, an older agent: no phase for that rank
        return None
    text = _decode(reply)
    if int(reply.get("offset") or 0) > 0:
        text = text.split("\n", 1)[-1]  # a partial first line
    return {"path": path, "text": text, "mtime": reply.get("mtime"), "now": reply.get("now")}


def rollout_files(session: NodeSession, procs: list[dict[str, Any]], user: str) -> dict[str, Any]:
    """The perf tracer files of the node's ranks and the tails of the job's logs."""
    log_dir = log_dir_from_processes([str(p.get("cmdline") or "") for p in procs], user)
    out: dict[str, Any] = {"log_dir": log_dir, "traces": [], "logs": []}
    if log_dir is None:
        return out
    ranked = [p for p in procs if isinstance(p.get("rank"), int)][:MAX_RANK_FILES]
    for p in ranked:
        role = p.get("role") if isinstance(p.get("role"), str) else None
        names = [f"traces-r{p['rank']}.jsonl"]
        candidates = [f"{log_dir}/perf_tracer/{role}/{names[0]}"] if role else []
        candidates.append(f"{log_dir}/perf_tracer/{names[0]}")
        for path in candidates:
            got = _tail(session, path, MAX_TAIL)
            if got is not None:
                out["traces"].append({"rank": p["rank"], "role": role, **got})
                break
    for name in LOGS:
        got = _tail(session, f"{log_dir}/{name}", LOG_TAIL)
        if got is not None:
            out["logs"].append(got)
    return out


def config_from_cmdlines(cmdlines: Iterable[str]) -> dict[str, Any]:
    """The staleness keys from AReaL command-line overrides (`rollout.X=N`), else its
    defaults; each value with where it came from."""
    found: dict[str, Any] = {}
    for cmd in cmdlines:
        for arg in cmd.split():
            key, eq, value = arg.lstrip("+").partition("=")
            if eq and key in DEFAULTS and key not in found and value.isdigit() and len(value) < 10:
                found[key] = {"value": int(value), "from": "command line"}
    for key, default in DEFAULTS.items():
        found.setdefault(key, {"value": default, "from": "AReaL's default"})
    return found


def summarize(
    nodes: list[dict[str, Any]], cmdlines: list[str], version: int | None
) -> RolloutSummary:
    """Counts, capacity and notes from the raw `rollout` entries of a capture's nodes."""
    summary = RolloutSummary()
    lines: list[str] = []
    traces = 0
    for node in nodes:
        raw = node.get("rollout")
        if not isinstance(raw, dict):
            continue
        traces += len(raw.get("traces") or [])
        for log in raw.get("logs") or []:
            if isinstance(log, dict) and isinstance(log.get("text"), str):
                lines.extend(log["text"].split("\n"))
    counts = last_counts(lines)
    if not traces and any(
        isinstance(n.get("rollout"), dict) and n["rollout"].get("log_dir") for n in nodes
    ):
        summary.notes.append(TRACER_OFF)
    if counts is None:
        if lines:
            summary.notes.append(TRACING_OFF)
        return summary
    config = config_from_cmdlines(cmdlines)
    summary.counts = counts
    summary.config = dict(config)
    summary.config["version"] = {
        "value": version if version is not None else 0,
        "from": "the servers' weight version" if version is not None else "assumed 0 (not known)",
    }
    summary.capacity = capacity(
        counts,
        version=version or 0,
        max_head_offpolicyness=config["rollout.max_head_offpolicyness"]["value"],
        consumer_batch_size=config["rollout.consumer_batch_size"]["value"],
        max_concurrent_rollouts=config["rollout.max_concurrent_rollouts"]["value"],
    )
    return summary


def node_phases(nodes: list[dict[str, Any]]) -> dict[tuple[str, int], RankPhase]:
    """(node, rank) -> phase, ages measured on each node's own clock."""
    found = []
    where: dict[tuple[str | None, int], str] = {}
    skew: dict[tuple[str | None, int], float] = {}
    for node in nodes:
        raw = node.get("rollout")
        if not isinstance(raw, dict):
            continue
        for t in raw.get("traces") or []:
            if not isinstance(t, dict) or not isinstance(t.get("rank"), int):
                continue
            mtime, now = t.get("mtime"), t.get("now")
            if not isinstance(mtime, int | float) or not isinstance(now, int | float):
                continue
            role = t.get("role") if isinstance(t.get("role"), str) else None
            # Ages on the node's clock: shift each mtime so that "now" is common.
            found.append(
                progress(role, t["rank"], str(t.get("text") or "").split("\n"), float(mtime))
            )
            where[(role, t["rank"])] = str(node.get("node"))
            skew[(role, t["rank"])] = float(now)
    if not found:
        return {}
    latest = max(skew.values())
    shifted = [
        type(p)(p.role, p.rank, p.last, p.order, p.written_at + (latest - skew[(p.role, p.rank)]))
        for p in found
    ]
    return {(where[(ph.role, ph.rank)], ph.rank): ph for ph in phases(shifted, latest)}


def apply_rollout(capture: StackCapture, raw: dict[str, Any]) -> None:
    """Set `ranks[].phase` and `capture.rollout` from a raw capture's node entries."""
    nodes = [n for n in raw.get("nodes") or [] if isinstance(n, dict)]
    if not any(isinstance(n.get("rollout"), dict) for n in nodes):
        return
    for (node, rank), phase in node_phases(nodes).items():
        for r in capture.ranks:
            if r.node == node and r.rank == rank:
                r.phase = phase
    versions = [
        r.server.weight_version
        for r in capture.ranks
        if r.server is not None and isinstance(r.server.weight_version, int)
    ]
    capture.rollout = summarize(
        nodes, [r.cmdline for r in capture.ranks], max(versions) if versions else None
    )
