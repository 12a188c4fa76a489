"""Node reports in the `nodes --json` shape (docs/cli-json.md), from agent samples."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_console.core.fleet import NodeFailure
from areal_console.core.records import ServerRow, areal_world_key

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
        "processes": [{k: p.get(k) for k in PROCESS_KEYS} for p in processes],
    }


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


def count_areal_world_sizes(process_lists: Iterable[list[dict[str, Any]]]) -> None:
    """World size of AReaL single-controller training workers over every node: the workers
    of one role in one experiment/trial (each node's agent can count only its own)."""
    lists = list(process_lists)

    def key(p: dict[str, Any]) -> tuple[Any, Any] | None:
        return areal_world_key(p.get("job"), p.get("role"), p.get("worker_index"), p.get("rank"))

    counts: dict[tuple[Any, Any], int] = {}
    for procs in lists:
        for p in procs:
            if (k := key(p)) is not None:
                counts[k] = counts.get(k, 0) + 1
    for procs in lists:
        for p in procs:
            if (k := key(p)) is not None:  # never below what one node counted alone
                p["world_size"] = max(counts[k], p.get("world_size") or 0)
