"""The Servers pane's rows and `nodes --json`'s servers: one per inference server of the
fleet, with the flags that need every server at once or the trainer's version added
(servers on different weight versions; a version lag beyond
`rollout.max_head_offpolicyness`; paused while the trainer moved on)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from areal_node.server_flags import fleet_flags

from areal_console.core.common.textfmt import sparkline
from areal_console.core.connection.records import ProcessRow, ServerFlagRow, ServerRow

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


def server_lines(
    nodes: Iterable[tuple[str, Iterable[ProcessRow]]],
    trainer_version: int | None = None,
    max_head_offpolicyness: int | None = None,
) -> list[ServerLine]:
    """Every server process of the nodes, sorted by node and address."""
    found = [(node, p) for node, procs in nodes for p in procs if p.server is not None]
    versions = {f"{node}:{p.pid}": p.server.weight_version for node, p in found if p.server}
    paused = {f"{node}:{p.pid}": p.server.paused for node, p in found if p.server}
    extra = fleet_flags(versions, trainer_version, max_head_offpolicyness, paused)
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
    trainer_version: int | None = None,
    max_head_offpolicyness: int | None = None,
) -> None:
    """Append the fleet's flags to each polled server's `flags` in `nodes --json`'s node
    entries (a kind the agent already raised for that server is not repeated)."""
    servers: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for p in node.get("processes") or []:
            srv = p.get("server") if isinstance(p, dict) else None
            if isinstance(srv, dict) and srv.get("polled"):
                servers[f"{node.get('name')}:{p.get('pid')}"] = srv
    extra = fleet_flags(
        {k: _version(s.get("weight_version")) for k, s in servers.items()},
        trainer_version,
        max_head_offpolicyness,
        {
            k: s.get("paused") if isinstance(s.get("paused"), bool) else None
            for k, s in servers.items()
        },
    )
    for key, flags in extra.items():
        srv = servers[key]
        listed: list[Any] = srv["flags"] if isinstance(srv.get("flags"), list) else []
        have = {f.get("kind") for f in listed if isinstance(f, dict)}
        srv["flags"] = listed + [f.to_json() for f in flags if f.kind not in have]


def _version(value: Any) -> int | str | None:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None
