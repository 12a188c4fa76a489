"""Which Ray actor and task each process on a Ray node is, from Ray's state API.

Ray reports each alive actor's worker pid and each running task's worker pid with their
node; the agent reports the node's processes by pid. Joined per node, every rank placed
by Ray (AReaL's `ray::run_func` SPMD tasks, `RayWorkerProcessLauncher` actors, Ray Train
workers) carries `processes[].ray = {actor_id, task_id, node_id}`. The pids are those
the node itself sees, so they match the agent's (both live in the node's PID namespace).

Ray Train sets its workers' rank variables inside the running process, where the agent
can't read them; Ray Train's own state (the dashboard's `/api/train/v2/runs/v1` for Train
V2, `/api/train/v2/runs` for Train V1, present where `ray[train]` is installed on the head
and state tracking is on) records each worker's world rank with its node id and pid: such
a process gets its rank from there, or keeps none (unknown).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


# Ray Train's run listings, newest API first: Train V2 (`train_runs[].attempts[].workers`,
# ray/train/v2/_internal/state/schema.py) and Train V1 (`train_runs[].workers`,
# ray/train/_internal/state/schema.py); each worker has world_rank, local_rank, node_id,
# pid and actor_id (ray/dashboard/modules/train/train_head.py, Ray 2.60).
TRAIN_ROUTES = ("/api/train/v2/runs/v1", "/api/train/v2/runs")
TRAIN_TIMEOUT = 5.0
TRAIN_REPLY_MAX = 16 * 1024 * 1024


@dataclass(frozen=True)
class TrainRank:
    """A Ray Train worker's place in its run, as Ray Train recorded it."""

    run: str
    rank: int
    local_rank: int | None
    world_size: int


TrainRanks = dict[tuple[str, int], TrainRank]  # (node id, pid) -> rank


def train_ranks_from_runs(doc: Any) -> TrainRanks:
    """Each worker of each run (the latest attempt of a Train V2 run) by node id and pid."""
    out: TrainRanks = {}
    runs = doc.get("train_runs") if isinstance(doc, Mapping) else None
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, Mapping):
            continue
        attempts = run.get("attempts")
        workers = run.get("workers")
        if isinstance(attempts, list) and attempts and isinstance(attempts[-1], Mapping):
            workers = attempts[-1].get("workers")
        if not isinstance(workers, list):
            continue
        good = [w for w in workers if isinstance(w, Mapping) and _is_int(w.get("world_rank"))
                and _is_int(w.get("pid")) and isinstance(w.get("node_id"), str)]  # fmt: skip
        name = str(run.get("name") or run.get("id") or "?")[:200]
        for w in good:
            local = w.get("local_rank")
            out[(w["node_id"], w["pid"])] = TrainRank(
                name, w["world_rank"], local if _is_int(local) else None, len(good)
            )
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def ray_train_ranks(
    dashboard: str, token: str | None, timeout: float = TRAIN_TIMEOUT
) -> TrainRanks:
    """Ray Train's workers on the cluster whose dashboard is at `dashboard`; empty where
    the dashboard has no Train state (no `ray[train]` on the head, tracking off)."""
    out: TrainRanks = {}
    for route in TRAIN_ROUTES:
        request = urllib.request.Request(f"{dashboard}{route}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                body = reply.read(TRAIN_REPLY_MAX + 1)
            if len(body) <= TRAIN_REPLY_MAX:
                out.update(train_ranks_from_runs(json.loads(body)))
        except (OSError, ValueError):
            continue
    return out
