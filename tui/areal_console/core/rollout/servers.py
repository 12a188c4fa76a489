"""The Servers pane's rows and `nodes --json`'s servers: one per inference server of the
fleet, with the flags that need every server of its run or its run's trainer added
(servers of one run on different weight versions; a version lag beyond the run's
`rollout.max_head_offpolicyness`; paused while the run's trainer moved on). A server's
run is told by `jobs.fleet_runs`; one no run can be told for gets none of these."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from areal_node.server_flags import ServerFlag, fleet_flags

from areal_console.core.common.textfmt import sparkline
from areal_console.core.connection.records import ProcessRow, ServerFlagRow, ServerRow
from areal_console.core.rollout.jobs import FleetRuns, Run, fleet_runs

# log_dir -> (the trainer's version, `rollout.max_head_offpolicyness`), None: not known
Trainers = Mapping[str, tuple[int | None, int | None]]

RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
QUEUED = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
KV_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class ServerLine:
    key: str  # node:pid
    node: str
    pid: int
    server: ServerRow
    flags: tuple[ServerFlagRow, ...]  # the agent's, then the fleet's


def throughput_trend(values: tuple[float, ...], width: int = 12) -> str:
    """The recent throughput as a sparkline scaled to its own maximum."""
    shown = [v for v in values if v == v and v >= 0][-width:]  # no NaN, no negative
    return sparkline(shown, width, top=max(shown, default=0.0))


def run_flags(
    versions: dict[str, int | str | None],
    paused: dict[str, bool | None],
    runs: FleetRuns | None = None,
    trainers: Trainers | None = None,
) -> dict[str, list[ServerFlag]]:
    """`fleet_flags` within each run: the servers (node:pid) of one run compared with one
    another and held to that run's trainer. Without `runs`, or on a fleet where no run is
    named, every server is one group with no trainer (version_skew only)."""
    if runs is None or not runs.runs:
        return fleet_flags(versions, None, None, paused)
    groups: dict[str, list[str]] = {}
    for key in versions:
        run = runs.of.get(key)
        if run is not None:  # no run told for it: no flag that needs one
            groups.setdefault(run, []).append(key)
    out: dict[str, list[ServerFlag]] = {}
    for log_dir, keys in groups.items():
        version, head = (trainers or {}).get(log_dir, (None, None))
        out.update(
            fleet_flags(
                {k: versions[k] for k in keys}, version, head, {k: paused.get(k) for k in keys}
            )
        )
    return out


def server_lines(
    nodes: Iterable[tuple[str, Iterable[ProcessRow]]],
    runs: FleetRuns | None = None,
    trainers: Trainers | None = None,
) -> list[ServerLine]:
    """Every server process of the nodes, sorted by node and address (`runs`: the run of
    each process, `trainers`: each run's trainer, see `run_flags`)."""
    found = [(node, p) for node, procs in nodes for p in procs if p.server is not None]
    versions = {f"{node}:{p.pid}": p.server.weight_version for node, p in found if p.server}
    paused = {f"{node}:{p.pid}": p.server.paused for node, p in found if p.server}
    extra = run_flags(versions, paused, runs, trainers)
    lines = []
    for node, p in found:
        assert p.server is not None
        key = f"{node}:{p.pid}"
        have = {f.kind for f in p.server.flags}
        fleet = tuple(
            ServerFlagRow(f.kind, f.evidence, f.remedy, f.config_key)
            for f in extra.get(key, [])
            if f.kind not in have
        )
        lines.append(ServerLine(key, node, p.pid, p.server, p.server.flags + fleet))
    lines.sort(key=lambda line: (line.node, line.server.address, line.pid))
    return lines


def add_fleet_flags(
    nodes: list[dict[str, Any]],
    runs: FleetRuns | None = None,
    trainers: Trainers | None = None,
) -> None:
    """Append the fleet's flags (`run_flags`) to each polled server's `flags` in `nodes
    --json`'s node entries (a kind the agent already raised for that server is not
    repeated)."""
    servers: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for p in node.get("processes") or []:
            srv = p.get("server") if isinstance(p, dict) else None
            if isinstance(srv, dict) and srv.get("polled"):
                servers[f"{node.get('name')}:{p.get('pid')}"] = srv
    extra = run_flags(
        {k: _version(s.get("weight_version")) for k, s in servers.items()},
        {
            k: s.get("paused") if isinstance(s.get("paused"), bool) else None
            for k, s in servers.items()
        },
        runs,
        trainers,
    )
    for key, flags in extra.items():
        srv = servers[key]
        listed: list[Any] = srv["flags"] if isinstance(srv.get("flags"), list) else []
        have = {f.get("kind") for f in listed if isinstance(f, dict)}
        srv["flags"] = listed + [f.to_json() for f in flags if f.kind not in have]


def _version(value: Any) -> int | str | None:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def row_runs(
    nodes: Iterable[tuple[str, Iterable[ProcessRow]]], user: str, known: Iterable[Run] = ()
) -> FleetRuns:
    """`jobs.fleet_runs` over the screen's process rows."""

    def record(p: ProcessRow) -> dict[str, Any]:
        return {"pid": p.pid, "ppid": p.ppid, "cmdline": p.cmdline, "job": p.job,
                "user": p.raw.get("user")}  # fmt: skip

    return fleet_runs([(node, [record(p) for p in procs]) for node, procs in nodes], user, known)
