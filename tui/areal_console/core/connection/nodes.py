"""Node reports in the `nodes --json` shape (docs/guide/cli-json.md), from agent samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_console.core.common.textfmt import capped
from areal_console.core.connection.fleet import NodeFailure
from areal_console.core.connection.records import MAX_CMDLINE

if TYPE_CHECKING:
    from areal_console.core.connection.records import ServerRow

GPU_KEYS = ("index", "name", "uuid", "util", "mem_used", "mem_total", "temp", "power")
PROCESS_KEYS = (
    "pid",
    "ppid",
    "cmdline",
    "rank",
    "local_rank",
    "world_size",
    "role",
    "job",
    "worker_index",
    "server",
    "cpu_percent",
    "rss",
    "state",
    "gpus",
    "gpu_memory",
)


def process_sort_key(p: dict[str, Any]) -> tuple[int, int, int]:
    """Ranks first in rank order, then launchers and other processes by pid."""
    rank = p.get("rank")
    return (0 if rank is not None else 1, rank if rank is not None else 0, p["pid"])


def node_report(name: str, host: str, result: Any) -> dict[str, Any]:
    """One node's entry; `result` is an agent `sample` result, a `NodeFailure`, or None."""
    if result is None or isinstance(result, NodeFailure | Exception):
        error = result.error if isinstance(result, NodeFailure) else str(result or "no answer")
        return {
            "name": name,
            "host": host,
            "state": "down",
            "error": error,
            "gpus": [],
            "gpu_error": None,
            "processes": [],
        }
    processes = sorted(result.get("processes", []), key=process_sort_key)
    return {
        "name": name,
        "host": host,
        "state": "up",
        "error": None,
        "gpus": [{k: g.get(k) for k in GPU_KEYS} for g in result.get("gpus", [])],
        "gpu_error": result.get("gpu_error"),
        "processes": [_process_entry(p) for p in processes],
    }


def _process_entry(p: dict[str, Any]) -> dict[str, Any]:
    entry = {k: p.get(k) for k in PROCESS_KEYS}
    if isinstance(entry["cmdline"], str):
        entry["cmdline"] = capped(entry["cmdline"], MAX_CMDLINE)
    return entry


def server_text(server: ServerRow | None) -> str:
    """`127.0.0.1:30000 ok 2ms` / `... down: connection refused`: a server's address and
    its last health answer ('' for a process that is no server)."""
    if server is None:
        return ""
    health = server.health
    if health is None:
        return f"{server.address} health ?"
    took = f" {health.latency_ms:.0f}ms" if health.latency_ms is not None else ""
    if health.ok:
        return f"{server.address} ok{took}"
    return f"{server.address} down: {health.error or 'no answer'}{took}"
