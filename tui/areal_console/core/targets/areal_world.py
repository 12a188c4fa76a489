"""The world an AReaL single-controller training worker belongs to, counted over nodes.

Kept apart from the typed records and the fleet: a stack capture counts worlds between
its dumps and its diagnosis, and needs nothing else of either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def areal_world_key(job: Any, role: Any, worker_index: Any, rank: Any) -> tuple[Any, Any] | None:
    """What an AReaL training worker's world is counted over: the workers of one role in
    one experiment/trial. None for any other process."""
    if worker_index is None or rank is None or not job:
        return None
    return (job, role)


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
