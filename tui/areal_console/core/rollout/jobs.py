"""Which job (run) each process and inference server of the fleet belongs to.

The trainer's version and `rollout.max_head_offpolicyness` belong to one run: its log
directory `<fileroot>/logs/<user>/<experiment>/<trial>`. Several runs may be alive on
the same nodes (a second trial, another user's experiment), so the version flags that
need the trainer (`version_lag`, `paused_after_update`) and the comparison between
servers (`version_skew`) apply within one run only. A process belongs to the run its
own command line names; else to the run its nearest ancestor names (AReaL's inference
servers are started by an `rpc_server` worker carrying `--experiment-name/--trial-name/
--fileroot`: areal/infra/rpc/guard/app.py:518-528, areal/engine/sglang_remote.py:438 at
cbff54d6); else, when the agent linked it to an experiment/trial (`job`), to the one
run of that name; else to the only run of the fleet. With several runs and nothing
saying which, it belongs to none, and no run's flags are raised on it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.metrics.logdir import log_dir_of, run_identity

MAX_DEPTH = 16  # ancestors walked up from a process


@dataclass(frozen=True, slots=True)
class Run:
    """One run: its log directory (its identity), the user it belongs to and its name."""

    log_dir: str
    owner: str
    label: str  # experiment/trial


@dataclass
class FleetRuns:
    """The runs named by the fleet's processes, and the run of each process (node:pid)."""

    runs: dict[str, Run] = field(default_factory=dict)  # log_dir -> run
    of: dict[str, str | None] = field(default_factory=dict)  # node:pid -> log_dir or None
    notes: list[str] = field(default_factory=list)

    def processes(
        self, nodes: Iterable[tuple[str, Iterable[Mapping[str, Any]]]], log_dir: str
    ) -> dict[str, list[Mapping[str, Any]]]:
        """node -> the run's process records there."""
        out: dict[str, list[Mapping[str, Any]]] = {}
        for node, procs in nodes:
            mine = [p for p in procs if self.of.get(f"{node}:{p.get('pid')}") == log_dir]
            if mine:
                out[node] = mine
        return out


@functools.lru_cache(maxsize=4096)
def _identity(cmdline: str) -> tuple[tuple[str, str], ...]:
    """`run_identity`, kept per command line: the live screen asks every refresh."""
    return tuple(run_identity(cmdline).items())


def own_run(p: Mapping[str, Any], user: str) -> Run | None:
    """The run a process's own command line names (as its own user's)."""
    identity = dict(_identity(str(p.get("cmdline") or "")))
    owner = str(p.get("user") or user)
    log_dir = log_dir_of(identity, owner)
    if log_dir is None:
        return None
    return Run(log_dir, owner, f"{identity['experiment']}/{identity['trial']}")


def fleet_runs(
    nodes: Iterable[tuple[str, Iterable[Mapping[str, Any]]]],
    user: str,
    known: Iterable[Run] = (),
) -> FleetRuns:
    """Each process's run (see the module's docstring). `nodes`: (node name, the agent's
    process records); `known`: runs learned elsewhere (a recorded trainer state), which
    count as the fleet's runs too."""
    listed = [(node, [p for p in procs if isinstance(p, Mapping)]) for node, procs in nodes]
    out = FleetRuns()
    for given in known:
        out.runs.setdefault(given.log_dir, given)
    own: dict[str, Run | None] = {}
    for node, procs in listed:
        for p in procs:
            run = own_run(p, user)
            own[f"{node}:{p.get('pid')}"] = run
            if run is not None:
                out.runs.setdefault(run.log_dir, run)
    by_label: dict[str, list[str]] = {}
    for run in out.runs.values():
        by_label.setdefault(run.label, []).append(run.log_dir)
    only = next(iter(out.runs)) if len(out.runs) == 1 else None
    for node, procs in listed:
        by_pid = {p.get("pid"): p for p in procs}
        for p in procs:
            key = f"{node}:{p.get('pid')}"
            found = _ancestor_run(p, by_pid, own, node)
            if found is None and isinstance(p.get("job"), str):
                named = by_label.get(p["job"], [])
                found = named[0] if len(named) == 1 else None
            out.of[key] = found if found is not None else only
    return out


def _ancestor_run(
    p: Mapping[str, Any],
    by_pid: Mapping[Any, Mapping[str, Any]],
    own: Mapping[str, Run | None],
    node: str,
) -> str | None:
    """The log directory of the process's own run, else of its nearest ancestor's."""
    cur: Mapping[str, Any] | None = p
    for _ in range(MAX_DEPTH):
        if cur is None:
            return None
        run = own.get(f"{node}:{cur.get('pid')}")
        if run is not None:
            return run.log_dir
        parent = cur.get("ppid")
        cur = by_pid.get(parent) if parent != cur.get("pid") else None
    return None


def unassigned_note(servers: Iterable[str], runs: FleetRuns) -> str | None:
    """The note for servers no run could be told for, when the fleet has several runs."""
    lost = sorted(k for k in servers if runs.of.get(k) is None)
    if not lost or len(runs.runs) < 2:
        return None
    shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
    return (
        f"{len(runs.runs)} runs on the fleet and nothing in the processes says which one "
        f"server {shown} belongs to: no version flag needing its run is raised on it"
    )
