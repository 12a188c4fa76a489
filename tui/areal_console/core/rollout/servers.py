"""The Servers pane's rows: one per inference server of the fleet, with the flags that
need every server at once (servers on different weight versions) added."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


def server_lines(nodes: Iterable[tuple[str, Iterable[ProcessRow]]]) -> list[ServerLine]:
    """Every server process of the nodes, sorted by node and address."""
    found = [(node, p) for node, procs in nodes for p in procs if p.server is not None]
    versions = {f"{node}:{p.pid}": p.server.weight_version for node, p in found if p.server}
    extra = fleet_flags(versions)
    lines = []
    for node, p in found:
        assert p.server is not None
        key = f"{node}:{p.pid}"
        fleet = tuple(
            ServerFlagRow(f.kind, f.evidence, f.remedy, f.config_key) for f in extra.get(key, [])
        )
        lines.append(ServerLine(key, node, p.pid, p.server, p.server.flags + fleet))
    lines.sort(key=lambda line: (line.node, line.server.address, line.pid))
    return lines
