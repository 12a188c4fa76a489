"""Which Ray actor and task each process on a Ray node is, from Ray's state API.

Ray reports each alive actor's worker pid and each running task's worker pid with their
node; the agent reports the node's processes by pid. Joined per node, every rank placed
by Ray (AReaL's `ray::run_func` SPMD tasks, `RayWorkerProcessLauncher` actors, Ray Train
workers) carries `processes[].ray = {actor_id, task_id, node_id}`. The pids are those
the node itself sees, so they match the agent's (both live in the node's PID namespace).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

RayIds = dict[str, dict[int, dict[str, Any]]]  # node id -> pid -> {actor_id, task_id, node_id}
LIST_LIMIT = 10_000  # the most the state API answers by default
LIST_TIMEOUT = 10


def ray_process_ids(address: str, node_ids: Iterable[str]) -> RayIds:
    """Per node id, the Ray identity of each worker pid; empty where Ray can't be asked
    (the `[ray]` extra missing, the state API failing): the ranks are then listed
    without it."""
    wanted = set(node_ids)
    out: RayIds = {n: {} for n in wanted}
    try:
        from ray.util.state import list_actors, list_tasks
    except ImportError:
        return out
    try:
        actors = list_actors(
            address=address,
            filters=[("state", "=", "ALIVE")],
            detail=True,
            limit=LIST_LIMIT,
            timeout=LIST_TIMEOUT,
            raise_on_missing_output=False,
        )
        tasks = list_tasks(
            address=address,
            filters=[("state", "=", "RUNNING")],
            detail=True,
            limit=LIST_LIMIT,
            timeout=LIST_TIMEOUT,
            raise_on_missing_output=False,
        )
    except Exception:  # the listing is a nicety on top of the agent's own
        return out
    return join_ids(actors, tasks, wanted)


def join_ids(actors: Iterable[Any], tasks: Iterable[Any], wanted: set[str]) -> RayIds:
    """Actor and running-task records (state API objects or dicts) as pid -> ids per node."""
    out: RayIds = {n: {} for n in wanted}
    for a in actors:
        node, pid = _get(a, "node_id"), _get(a, "pid")
        if node in out and isinstance(pid, int) and pid > 0:
            out[node][pid] = {"actor_id": _get(a, "actor_id"), "task_id": None, "node_id": node}
    for t in tasks:
        node, pid = _get(t, "node_id"), _get(t, "worker_pid")
        if node not in out or not isinstance(pid, int) or pid <= 0:
            continue
        entry = out[node].setdefault(pid, {"actor_id": None, "task_id": None, "node_id": node})
        entry["task_id"] = _get(t, "task_id")
        entry["actor_id"] = entry["actor_id"] or _get(t, "actor_id")
    return out


def _get(record: Any, key: str) -> Any:
    return record.get(key) if isinstance(record, dict) else getattr(record, key, None)
