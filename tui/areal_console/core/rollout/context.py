"""What a stack capture learns about the rollout side from the job's own files.

During a capture each node's agent is asked (`file_tail` / `file_read`, bounded, with
the job's user as the owner: the agent opens without following a final symlink, without
blocking on a FIFO, follows a symlink on the way only when root, itself or that user
owns it, and reads only that user's regular files) for the files AReaL writes under the
job's log directory `<fileroot>/logs/<user>/<experiment>/<trial>`: each rank's perf
tracer file (`perf_tracer[/<role>]/traces-r{rank}.jsonl`, its last MiB), its session
tracer file (`session_tracer[/<role>]/sessions-r{rank}.jsonl`, counted as it streams,
at most its last SESSION_MAX bytes), the tail of the rollout and controller logs (the
executor's tracing lines, the trainer's `Train step N/T done.`), and the run's config
(the `--config` file a command line names, the `config.yaml` AReaL saves there).
`apply_rollout` turns them into `ranks[].phase`, the capture's `rollout` summary (the
staleness capacity recomputed, with its zero term named; the trainer's version) and the
servers' version flags.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_node.constants import config_key
from areal_node.server_flags import fleet_flags

from areal_console.core.metrics.logdir import log_dir_from_processes, run_identity, safe_component
from areal_console.core.rollout.job_config import DEFAULTS, config_paths, staleness_config
from areal_console.core.rollout.jobs import FleetRuns, fleet_runs, unassigned_note
from areal_console.core.rollout.perf_trace import MAX_TAIL, RankPhase, phases, progress
from areal_console.core.rollout.scaling import Scaling, job_mode, scaling
from areal_console.core.rollout.staleness import (
    MAX_RECORD,
    Capacity,
    RolloutCounts,
    SessionTally,
    capacity,
    last_counts,
    session_counts,
)
from areal_console.core.rollout.trainer_version import TrainerVersion, trainer_version

if TYPE_CHECKING:
    from areal_console.core.connection.fleet import NodeSession
    from areal_console.core.stacks.records import StackCapture

LOG_TAIL = 256 << 10  # bytes of each log read for tracing lines
LOGS = ("rollout.log", "main.log", "trainer.log")
MAX_RANK_FILES = 256  # trace files read per node
SESSION_MAX = 32 << 20  # bytes of one session tracer file counted (its end)
SESSION_CHUNK = 4 << 20
CONFIG_MAX = 256 << 10  # bytes of a config file (AReaL's saved config.yaml is ~20 KiB)
MAX_CONFIGS = 4
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
    trainer: TrainerVersion | None = None  # the trainer's weight version, when known

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
                "running_known": self.counts.running_known,
                "complete": self.counts.complete,
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
            "trainer_version": None
            if self.trainer is None
            else {"version": self.trainer.version, "evidence": self.trainer.evidence},
        }

    @classmethod
    def from_json(cls, doc: Any) -> RolloutSummary | None:
        """A saved capture's `rollout` (its capacity recomputed from counts and config)."""
        if not isinstance(doc, dict):
            return None
        out = cls(notes=[str(n)[:500] for n in (doc.get("notes") or [])[:8] if isinstance(n, str)])
        tv = doc.get("trainer_version")
        if isinstance(tv, dict) and type(tv.get("version")) is int:
            out.trainer = TrainerVersion(tv["version"], str(tv.get("evidence") or "")[:500])
        counts, config = doc.get("counts"), doc.get("config")
        if not isinstance(counts, dict) or not isinstance(config, dict):
            return out
        try:
            e, r, a, j = (int(counts[k]) for k in ("enqueued", "running", "accepted", "rejected"))
            out.counts = RolloutCounts(
                e,
                r,
                a,
                j,
                str(counts.get("source") or "")[:500],
                counts.get("running_known") is not False,
                counts.get("complete") is not False,
            )
            values = {k: config[k]["value"] for k in (*DEFAULTS, "version")}
            dp = config.get("dp_size") or {"value": 1, "from": "not saved"}
            values["dp_size"] = dp["value"]
            out.config = {
                k: {"value": v, "from": str((config.get(k) or dp).get("from"))[:300]}
                for k, v in values.items()
            }
            out.capacity = capacity(
                out.counts,
                int(values["version"]),
                int(values["rollout.max_head_offpolicyness"]),
                int(values["rollout.consumer_batch_size"]),
                None
                if values["rollout.max_concurrent_rollouts"] is None
                else int(values["rollout.max_concurrent_rollouts"]),
                int(values["dp_size"]),
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            out.counts = out.capacity = None
        return out


def _decode(reply: dict[str, Any], limit: int = MAX_TAIL) -> str:
    data = reply.get("data")
    if not isinstance(data, str):
        return ""
    try:
        raw = zlib.decompressobj().decompress(base64.b64decode(data), limit + 1)
    except (ValueError, zlib.error):
        return ""
    return raw.decode("utf-8", "replace")


def _tail(session: NodeSession, path: str, limit: int, owner: str) -> dict[str, Any] | None:
    """The last `limit` bytes of the job's user's file on the node (None: absent,
    refused or unreadable)."""
    try:
        head = session.call(
            "file_tail", {"path": path, "offset": 0, "max_bytes": 1, "owner": owner}, timeout=10
        )
        size = int(head.get("size") or 0)
        reply = head
        if size > 1:
            offset = max(0, size - limit)
            reply = session.call(
                "file_tail",
                {"path": path, "offset": offset, "ident": head.get("ident"),
                 "max_bytes": limit, "owner": owner},
                timeout=20,
            )  # fmt: skip
    except Exception:  # absent, refused, an older agent: no phase for that rank
        return None
    text = _decode(reply)
    if int(reply.get("offset") or 0) > 0:
        text = text.split("\n", 1)[-1]  # a partial first line
    return {"path": path, "text": text, "mtime": reply.get("mtime"), "now": reply.get("now")}


def _count_sessions(session: NodeSession, path: str, owner: str) -> dict[str, Any] | None:
    """Session records of one file counted by status, streamed in chunks (at most the
    file's last SESSION_MAX bytes; `complete` says whether that was all of it)."""
    tally = SessionTally()
    args: dict[str, Any] = {"path": path, "offset": 0, "max_bytes": 1, "owner": owner}
    try:
        head = session.call("file_tail", args, timeout=10)
        size = int(head.get("size") or 0)
        start = offset = max(0, size - SESSION_MAX)
        args.update(ident=head.get("ident"), max_bytes=SESSION_CHUNK)
        partial = start > 0  # the first line read is the end of a record: not counted
        rest = ""
        while offset < size:
            reply = session.call("file_tail", {**args, "offset": offset}, timeout=20)
            nxt = int(reply.get("next") or 0)
            if nxt <= offset or reply.get("rotated") or reply.get("truncated"):
                break
            lines = (rest + _decode(reply, SESSION_CHUNK)).split("\n")
            rest = lines.pop()  # the unfinished last line
            if partial and lines:
                lines, partial = lines[1:], False
            tally.add(lines)
            if len(rest) > MAX_RECORD:  # no record is that long: drop it as it grows
                rest, tally.skipped = "", tally.skipped + 1
            offset = nxt
        if not partial:
            tally.add([rest])
    except Exception:  # absent, refused, an older agent: no counts from this file
        return None
    return {"path": path, "accepted": tally.accepted, "rejected": tally.rejected,
            "pending": tally.pending, "records": tally.records, "skipped": tally.skipped,
            "complete": start == 0}  # fmt: skip


def _read_config(session: NodeSession, path: str, owner: str) -> dict[str, Any]:
    """A config file's text (or why it was not read)."""
    try:
        reply = session.call(
            "file_read", {"path": path, "max_bytes": CONFIG_MAX, "owner": owner}, timeout=10
        )
    except Exception as exc:
        return {"path": path, "error": str(exc)[:300]}
    if reply.get("truncated"):
        return {"path": path, "error": f"larger than {CONFIG_MAX >> 10} KiB: not read"}
    return {"path": path, "text": str(reply.get("text") or "")}


def rank_file(log_dir: str, subdir: str, name: str, role: str | None) -> list[str]:
    """Where AReaL puts a rank's tracer file: under its role folder, else directly. The
    role is a process's `--role`: one path component or none (`../..` steers nowhere)."""
    role_dir = [f"{log_dir}/{subdir}/{role}/{name}"] if role and safe_component(role) else []
    return [*role_dir, f"{log_dir}/{subdir}/{name}"]


def job_configs(
    session: NodeSession, procs: list[dict[str, Any]], log_dir: str | None, user: str
) -> list[dict[str, Any]]:
    """The `--config` files the processes' command lines name (absolute paths: AReaL
    resolves a relative one against its own working directory), each read as the file of
    the user running the process that names it (another user's `--config
    /root/secret.yaml` is that user's file or nothing), and the log directory's saved
    `config.yaml` (the job's user's), lowest precedence first."""
    named: dict[str, str] = {}
    for p in procs:
        owner = str(p.get("user") or user)
        for path in config_paths(str(p.get("cmdline") or "")):
            named.setdefault(path, owner)
    out = []
    for path, owner in list(named.items())[:MAX_CONFIGS]:
        if path.startswith("/"):
            out.append({**_read_config(session, path, owner), "kind": "config"})
        else:
            out.append({"path": path, "kind": "config",
                        "error": "a relative path (AReaL reads it from its working directory)"})  # fmt: skip
    if log_dir is not None:
        saved = _read_config(session, f"{log_dir}/config.yaml", user)
        if "text" in saved:
            out.append({**saved, "kind": "saved"})
    return out


def rollout_files(
    session: NodeSession,
    procs: list[dict[str, Any]],
    user: str,
    max_ranks: int = MAX_RANK_FILES,
    sessions: bool = True,
    log_dir: str | None = None,
) -> dict[str, Any]:
    """The perf and session tracer files of the node's ranks (the first `max_ranks`;
    session files only with `sessions`), the tails of the job's logs and the run's config
    files, each read as the job's user's file only. `log_dir`: the run's, when known
    (else the first one the processes name)."""
    if log_dir is None:
        log_dir = log_dir_from_processes([str(p.get("cmdline") or "") for p in procs], user)
    out: dict[str, Any] = {"log_dir": log_dir, "traces": [], "sessions": [], "logs": []}
    out["configs"] = job_configs(session, procs, log_dir, user)
    if log_dir is None:
        return out
    ranked = sorted(
        (p for p in procs if isinstance(p.get("rank"), int)), key=lambda p: int(p["rank"])
    )[: min(max_ranks, MAX_RANK_FILES)]
    for p in ranked:
        role = p.get("role") if isinstance(p.get("role"), str) else None
        for path in rank_file(log_dir, "perf_tracer", f"traces-r{p['rank']}.jsonl", role):
            got = _tail(session, path, MAX_TAIL, user)
            if got is not None:
                out["traces"].append({"rank": p["rank"], "role": role, **got})
                break
        name = f"sessions-r{p['rank']}.jsonl"
        for path in rank_file(log_dir, "session_tracer", name, role) if sessions else []:
            counted = _count_sessions(session, path, user)
            if counted is not None:
                out["sessions"].append({"rank": p["rank"], "role": role, **counted})
                break
    for name in LOGS:
        got = _tail(session, f"{log_dir}/{name}", LOG_TAIL, user)
        if got is not None:
            out["logs"].append(got)
    return out


def _session_counts(nodes: list[dict[str, Any]]) -> RolloutCounts | None:
    """Counts from the session tracer files: each rank's executor has its own manager,
    so the rank with the most accepted sessions is shown (its term is the first to
    reach zero)."""
    best: RolloutCounts | None = None
    for node in nodes:
        raw = node.get("rollout")
        for f in (raw.get("sessions") or []) if isinstance(raw, dict) else []:
            if not isinstance(f, dict):
                continue
            tally = SessionTally()
            for key in ("accepted", "rejected", "pending", "records"):
                value = f.get(key)
                setattr(tally, key, value if type(value) is int and value >= 0 else 0)
            counts = session_counts(tally, str(f.get("path"))[:300], f.get("complete") is True)
            if counts is not None and (best is None or counts.accepted > best.accepted):
                best = counts
    return best


def _texts(nodes: list[dict[str, Any]], kind: str) -> list[list[str]]:
    out = []
    for node in nodes:
        raw = node.get("rollout")
        for t in (raw.get(kind) or []) if isinstance(raw, dict) else []:
            if isinstance(t, dict) and isinstance(t.get("text"), str):
                out.append(t["text"].split("\n"))
    return out


def job_config(
    nodes: list[dict[str, Any]], cmdlines: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """The staleness keys from the config files the nodes read and the command lines."""
    documents: list[tuple[str, str]] = []
    notes = []
    seen = set()
    entries = [
        c
        for node in nodes
        if isinstance(node.get("rollout"), dict)
        for c in node["rollout"].get("configs") or []
        if isinstance(c, dict)
    ]
    for c in sorted(entries, key=lambda c: c.get("kind") == "saved"):  # saved last: it wins
        path = str(c.get("path"))[:300]
        if path not in seen and isinstance(c.get("text"), str):
            seen.add(path)
            documents.append((path, c["text"]))
    for c in entries:  # a file no node could read (one node's copy is enough)
        path = str(c.get("path"))[:300]
        if path not in seen and c.get("error"):
            seen.add(path)
            notes.append(f"config {path} not read: {str(c['error'])[:200]}")
    config, problems = staleness_config(cmdlines, documents)
    return config, notes + problems


def summarize(
    nodes: list[dict[str, Any]], cmdlines: list[str], version: int | None
) -> RolloutSummary:
    """Counts, capacity, the trainer's version and notes from the raw `rollout` entries
    of a capture's nodes (`version`: the servers' newest, used when the trainer's is
    not known)."""
    summary = RolloutSummary()
    logs = _texts(nodes, "logs")
    traces = _texts(nodes, "traces")
    summary.trainer = trainer_version(logs, traces)
    counts = last_counts(line for lines in logs for line in lines)
    if counts is None:
        counts = _session_counts(nodes)
    if not traces and any(
        isinstance(n.get("rollout"), dict) and n["rollout"].get("log_dir") for n in nodes
    ):
        summary.notes.append(TRACER_OFF)
    config, notes = job_config(nodes, cmdlines)
    summary.notes.extend(notes[:4])
    summary.config = dict(config)
    if counts is None:
        if logs:
            summary.notes.append(TRACING_OFF)
        return summary
    if summary.trainer is not None:
        used, source = summary.trainer.version, f"the trainer ({summary.trainer.evidence})"
    elif version is not None:
        used, source = version, "the servers' weight version"
    else:
        used, source = 0, "assumed 0 (not known)"
    summary.counts = counts
    summary.config["version"] = {"value": used, "from": source}
    scale = job_scaling(nodes, config.get("actor.backend"))
    summary.config["mode"] = {"value": scale.mode, "from": scale.mode_evidence}
    summary.config["dp_size"] = {"value": scale.dp_size, "from": scale.source}
    if scale.note:
        summary.notes.append(scale.note)
    summary.capacity = capacity(
        counts,
        version=used,
        max_head_offpolicyness=config["rollout.max_head_offpolicyness"]["value"] or 0,
        consumer_batch_size=config["rollout.consumer_batch_size"]["value"] or 1,
        max_concurrent_rollouts=config["rollout.max_concurrent_rollouts"]["value"],
        dp_size=scale.dp_size,
    )
    return summary


def job_scaling(nodes: list[dict[str, Any]], backend: dict[str, Any] | None) -> Scaling:
    """The job's mode and the data-parallel size its capacity is divided by, from the
    nodes' process records and `actor.backend`."""
    procs = [
        p
        for n in nodes
        if isinstance(n.get("processes"), list)
        for p in n["processes"]
        if isinstance(p, dict)
    ]
    mode, evidence = job_mode(procs)
    worlds = [p["world_size"] for p in procs if type(p.get("world_size")) is int]
    return scaling(mode, evidence, backend, max(worlds) if worlds else None)


MAX_RUNS = 3  # runs whose trainer one read asks for (those with versioned servers first)
MAX_RUN_NODES = 2  # nodes asked per run (a log directory is usually on a shared file system)


@dataclass
class FleetTrainers:
    """The trainer's version and `rollout.max_head_offpolicyness` of each run read (by
    log directory), the run of every process, and the runs left unread."""

    runs: FleetRuns
    read: dict[str, RolloutSummary] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # runs' labels, not read this time
    notes: list[str] = field(default_factory=list)


def nodes_to_ask(placed: Mapping[str, list[Mapping[str, Any]]], limit: int) -> list[str]:
    """The nodes of a run (node -> its processes there) to read its files on: the
    controller's first, then the lowest rank's, at most `limit`."""

    def order(name: str) -> tuple[int, int, str]:
        procs = placed[name]
        ranks = [p["rank"] for p in procs if type(p.get("rank")) is int]
        controller = any(p.get("role") == "controller" for p in procs)
        return (0 if controller else 1, min(ranks, default=1 << 30), name)

    return sorted(placed, key=order)[:limit]


def reports_version(process: Any) -> bool:
    """A polled server (a process record's `server`) that reports an integer weight
    version: the servers the version flags are about."""
    srv = process.get("server") if isinstance(process, dict) else None
    return (
        isinstance(srv, dict) and bool(srv.get("polled")) and type(srv.get("weight_version")) is int
    )


def versioned_servers(nodes: Iterable[dict[str, Any]]) -> bool:
    """Does some polled server report a weight version (else no flag needs the trainer)?"""
    return any(reports_version(p) for n in nodes for p in n.get("processes") or [])


def versioned_runs(nodes: list[dict[str, Any]], runs: FleetRuns) -> dict[str, list[str]]:
    """log_dir -> its polled servers (node:pid) that report a weight version."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        for p in node.get("processes") or []:
            if reports_version(p):
                key = f"{node.get('name')}:{p.get('pid')}"
                run = runs.of.get(key)
                if run is not None:
                    out.setdefault(run, []).append(key)
    return out


def run_trainer(summary: RolloutSummary) -> tuple[int | None, int | None]:
    """A run's (trainer's version, `rollout.max_head_offpolicyness`), None where not found."""
    head = summary.config.get("rollout.max_head_offpolicyness") or {}
    value = head.get("value")
    version = summary.trainer.version if summary.trainer is not None else None
    return version, value if type(value) is int else None


def fleet_trainer_state(
    sessions: Iterable[NodeSession],
    nodes: list[dict[str, Any]],
    user: str,
    max_runs: int = MAX_RUNS,
    max_nodes: int = MAX_RUN_NODES,
) -> FleetTrainers:
    """What the version flags need, per run, read lightly (the logs' tails, the config
    files, the lowest rank's perf tracer file, on at most `max_nodes` nodes of the run):
    the trainer's version and `rollout.max_head_offpolicyness` of each run that has a
    polled server reporting a weight version, at most `max_runs` of them (the runs with
    the most such servers first; the others are named in `skipped`)."""
    up = [n for n in nodes if n.get("state") == "up"]
    listed = [(str(n.get("name")), list(n.get("processes") or [])) for n in up]
    runs = fleet_runs(listed, user)
    out = FleetTrainers(runs)
    note = unassigned_note(server_keys(up), runs)
    if note:
        out.notes.append(note)
    wanted = versioned_runs(up, runs)
    order = sorted(wanted, key=lambda d: (-len(wanted[d]), runs.runs[d].label, d))
    out.skipped = [runs.runs[d].label for d in order[max_runs:]]
    by_session = {s.name: s for s in sessions}
    for log_dir in order[:max_runs]:
        run = runs.runs[log_dir]
        placed = runs.processes(listed, log_dir)
        raw = []
        cmdlines: list[str] = []
        reachable = {n: ps for n, ps in placed.items() if n in by_session}
        for name in nodes_to_ask(reachable, max_nodes):
            mine = [dict(p) for p in placed[name]]
            cmdlines.extend(str(p.get("cmdline") or "") for p in mine)
            files = rollout_files(
                by_session[name], mine, run.owner, max_ranks=1, sessions=False, log_dir=log_dir
            )
            raw.append({"node": name, "rollout": files, "processes": mine})
        out.read[log_dir] = summarize(raw, cmdlines, None)
    return out


def server_keys(nodes: list[dict[str, Any]]) -> list[str]:
    """node:pid of every server process on `nodes`."""
    return [
        f"{n.get('name')}:{p.get('pid')}"
        for n in nodes
        for p in n.get("processes") or []
        if isinstance(p, dict) and isinstance(p.get("server"), dict)
    ]


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
    add_server_flags(capture)


def add_server_flags(capture: StackCapture) -> None:
    """The fleet's flags on the capture's servers: servers on different versions, and
    with the trainer's version, a lag beyond `rollout.max_head_offpolicyness` and a
    server paused while the trainer moved on (a kind already raised is not repeated).
    A capture is one job's, so one run's; one whose ranks name several runs (`--all-jobs`)
    gets none of these, and a note says why."""
    servers = {f"{r.node}:{r.pid}": r.server for r in capture.ranks if r.server is not None}
    summary = capture.rollout
    trainer = summary.trainer.version if summary and summary.trainer else None
    head = (summary.config if summary else {}).get("rollout.max_head_offpolicyness")
    named = {
        (i.get("fileroot"), i["experiment"], i["trial"])
        for r in capture.ranks
        if (i := run_identity(r.cmdline)).get("experiment") and i.get("trial")
    }
    if len(named) > 1:  # an --all-jobs capture: one run's trainer holds no other run's servers
        if summary is not None:
            summary.notes.append(
                f"{len(named)} runs in this capture: no version_skew, version_lag or "
                "paused_after_update across them (capture one job for those)"
            )
        return
    extra = fleet_flags(
        {k: s.weight_version for k, s in servers.items()},
        trainer,
        head.get("value") if isinstance(head, dict) else None,
        {k: s.paused for k, s in servers.items()},
    )
    for key, flags in extra.items():
        srv = servers[key]
        have = {f.get("kind") for f in srv.flags}
        srv.flags.extend(f.to_json() for f in flags if f.kind not in have)
