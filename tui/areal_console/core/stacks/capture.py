"""Capture every rank's stack on every node at once, through the fleet's agents.

1. Every node's processes (one `sample` per node, in parallel; no CPU% wait, no NVML) --
   or the latest sample the caller already has (the TUI's monitor).
2. Group them into jobs (`scope.py`) and choose ONE: the only job there is, `job`, or all
   with `all_jobs`. Several jobs and no choice raise `JobChoiceError` (listing them).
3. `pyspy` on every node in parallel (the agent runs py-spy on its cores in parallel),
   `samples` times.

The result is a raw capture (see `parsing.py`) turned into a `StackCapture` and saved.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from areal_console.core.common.errors import UserError
from areal_console.core.common.identity import login_user
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.records import StackCapture, now_iso
from areal_console.core.stacks.report import AnalysedCapture, analysed
from areal_console.core.stacks.scope import (
    JobChoiceError,
    JobGroup,
    choose_job,
    group_jobs,
)
from areal_console.core.stacks.store import new_capture_id, save_capture
from areal_console.core.targets.areal_world import count_areal_world_sizes

__all__ = [
    "CaptureOptions",
    "JobChoiceError",
    "capture_and_analyse",
    "capture_raw",
    "sample_nodes",
    "take_capture",
]

# `--source`: where each rank's stack comes from (the agent's `pyspy` op, `source`).
STACK_SOURCE_CHOICES = ("auto", "py-spy", "worker")

# Why a capture that found no rank is not saved (shown where its id would be).
NOTHING_CAPTURED = "no rank found, nothing captured"

# (node, pid, ok, done on that node, total on that node) after each dump
Progress = Callable[[str, int, bool, int, int], None]


@dataclass
class CaptureState:
    """What the console's next capture asks for, one object shared by the App (`s`) and
    the Stacks screen (`N`, `L`, `r`): the command-line filter, py-spy's --native and
    --locals, and the job chosen for the last capture (`r` captures the same job)."""

    match: str | None = None  # regex on the command line
    native: bool = False  # py-spy --native (Stacks screen: N)
    with_locals: bool = False  # py-spy --locals (Stacks screen: L)
    job: str | None = None  # the job chosen for the last capture

    def toggle(self, what: Literal["native", "locals"]) -> bool:
        """Flip --native or --locals; the new value."""
        if what == "native":
            self.native = not self.native
            return self.native
        self.with_locals = not self.with_locals
        return self.with_locals


@dataclass
class CaptureOptions:
    samples: int = 1
    interval: float = 1.0
    match: str | None = None  # regex on the command line
    timeout: float = 15.0  # per py-spy run
    nonblocking: bool = False
    job: str | None = None  # a job key (or a unique part of one); see scope.py
    all_jobs: bool = False  # every job on the nodes (opt out of the one-job scope)
    slurm_job: str | None = None  # only processes whose SLURM_JOB_ID is this
    native: bool = False  # py-spy --native: C/C++ frames too (NCCL under a collective)
    with_locals: bool = False  # py-spy --locals: each frame's variables
    # Set to stop between samples (Ctrl-C): what was sampled so far is kept.
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    on_sample: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    ledger: bool = True  # also read Flight Recorder traces (the collective ledger)
    # Where stacks come from: "auto" (py-spy, else the rank's worker server where py-spy
    # cannot attach or is missing), "py-spy" only, or "worker" (the worker server only).
    source: str = "auto"
    rollout: bool = True  # also read perf tracer files and rollout tracing lines
    tags: tuple[str, ...] = ()  # saved with the capture (`stacks --list` shows them): "watch"
    # What the stacks cannot show, fed into the diagnosis (core/stacks/slow_evidence.py):
    # the job's roles whose Slurm job ended (`EndedRole.to_json()`), and the ranks whose GPU
    # idled while the others' were busy (`IdleRank.to_json()`, the Cluster screen's samples).
    ended_roles: tuple[dict[str, Any], ...] = ()
    idle_gpus: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError("samples must be at least 1")
        if self.interval < 0:
            raise ValueError("interval must not be negative")
        if self.match:
            try:
                re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"bad --match regex {self.match!r}: {exc}") from None
        if self.source not in STACK_SOURCE_CHOICES:
            choices = ", ".join(STACK_SOURCE_CHOICES)
            raise ValueError(f"--source must be one of {choices}, not {self.source!r}")
        if self.job is not None and self.all_jobs:
            raise ValueError("--job and --all-jobs exclude each other")


def sample_nodes(
    fleet: Fleet, sessions: list[NodeSession] | None = None
) -> dict[str, list[dict[str, Any]] | NodeFailure]:
    """Every node's candidate processes (no CPU% baseline wait, NVML untouched)."""
    args = {"all": False, "cpu": False, "gpus": False}
    results = fleet.fan_out(lambda s: s.call("sample", args, timeout=30), sessions)
    return {
        name: r if isinstance(r, NodeFailure) else list(r.get("processes", []))
        for name, r in results.items()
    }


def scope_processes(
    sampled: dict[str, list[dict[str, Any]]], options: CaptureOptions
) -> list[JobGroup]:
    """The job(s) a capture with `options` takes from these processes."""
    jobs = group_jobs(sampled, options.match, options.slurm_job)
    return jobs if options.all_jobs else choose_job(jobs, options.job, options.match)


def dump_node(
    session: NodeSession,
    procs: list[dict[str, Any]],
    options: CaptureOptions,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Raw capture of one node: `samples` rounds of dumps of `procs`."""
    procs = sorted(procs, key=lambda p: p["pid"])
    node: dict[str, Any] = {"node": session.name, "error": None, "processes": procs, "samples": []}
    pids = [p["pid"] for p in procs]
    if not pids:
        return node
    args: dict[str, Any] = {
        "pids": pids,
        "timeout": options.timeout,
        "nonblocking": options.nonblocking,
        "native": options.native,
        "locals": options.with_locals,
        "source": options.source,
    }
    token = None
    if progress is not None:
        token = f"capture-{id(node)}"
        args["progress"] = token
        session.progress_listeners[token] = lambda m: progress(
            session.name, int(m["pid"]), bool(m["ok"]), int(m["done"]), int(m["total"])
        )
    try:
        next_at = time.monotonic()
        for i in range(options.samples):
            if i:
                next_at += options.interval
                if options.cancel.wait(max(0.0, next_at - time.monotonic())):
                    break
            if options.cancel.is_set():
                break
            reply = session.call("pyspy", args, timeout=options.timeout + 30)
            node["samples"].append(reply.get("dumps", []))
            if options.on_sample is not None and options.samples > 1:
                options.on_sample(f"{session.name}: sample {i + 1}/{options.samples}")
    finally:
        if token is not None:
            session.progress_listeners.pop(token, None)
    if options.ledger:
        node["fr"] = fr_traces(session, procs)
    if options.rollout:
        from areal_console.core.rollout.context import rollout_files  # while nodes answer

        node["rollout"] = rollout_files(session, procs, login_user())
    return node


def fr_traces(session: NodeSession, procs: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's Flight Recorder traces (live and dump files), or why there are none."""
    pids = [p["pid"] for p in procs if p.get("rank") is not None]
    try:
        return session.call("fr_traces", {"pids": pids, "timeout": 5.0}, timeout=60)
    except Exception as exc:  # an older agent, a node gone: the ledger says so, stacks stay
        return {"error": f"Flight Recorder traces not read: {exc}"}


def capture_raw(
    fleet: Fleet,
    options: CaptureOptions,
    sampled: Mapping[str, list[dict[str, Any]] | NodeFailure] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """All nodes in parallel; a node that fails becomes an error entry, not an exception.

    `sampled` (node -> process records) skips the sampling round; a node missing from it
    is sampled now. Raises `JobChoiceError` when the job must be chosen first.
    """
    started = now_iso()
    sampled = dict(sampled or {})
    missing = [s for s in fleet.sessions if s.name not in sampled]
    if missing:
        sampled.update(sample_nodes(fleet, missing))
    failed = {n: r for n, r in sampled.items() if isinstance(r, NodeFailure)}
    ok = {n: r for n, r in sampled.items() if not isinstance(r, NodeFailure)}
    jobs = scope_processes(ok, options)
    chosen: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        for name, procs in job.processes.items():
            chosen.setdefault(name, []).extend(procs)
    sessions = [s for s in fleet.sessions if s.name in chosen]
    # A node's deadline covers its dumps, and is never shorter than one dump may take
    # (`--timeout`); the waits between samples come on top.
    deadline = fleet.node_timeout
    if deadline is not None:
        deadline = max(deadline, options.timeout) + (options.samples - 1) * options.interval
    results = fleet.fan_out(
        lambda s: dump_node(s, chosen[s.name], options, progress), sessions, node_timeout=deadline
    )
    nodes: list[dict[str, Any]] = [
        {"node": name, "error": f.error, "processes": [], "samples": []}
        for name, f in failed.items()
    ]
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            nodes.append({"node": name, "error": result.error, "processes": [], "samples": []})
        else:
            nodes.append(result)
    count_areal_world_sizes(n["processes"] for n in nodes)
    raw: dict[str, Any] = {
        "captured_at": started,
        "user": login_user(),
        "interval": options.interval,
        "job": ", ".join(j.key for j in jobs) or None,
        "nodes": nodes,
        "ended_roles": list(options.ended_roles),
        "idle_gpus": list(options.idle_gpus),
    }
    if options.ledger:
        ras = nccl_ras(sessions, chosen)
        if ras is not None:
            raw["nccl_ras"] = ras
    return raw


RAS_NODES = 3  # nodes asked, one after another, for a RAS port (one report covers the job)


def nccl_ras(
    sessions: list[NodeSession], chosen: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any] | None:
    """NCCL's RAS report of the job, from the first of a few nodes where a rank serves
    one (NCCL >= 2.24 gathers it from every process of the job); None where no rank does
    (no NCCL, an older one, a CPU job): nothing to show."""
    last = None
    for session in sessions[:RAS_NODES]:
        pids = [p["pid"] for p in chosen.get(session.name, []) if p.get("rank") is not None]
        if not pids:
            continue
        try:
            reply = session.call("nccl_ras", {"pids": pids, "timeout": 10.0}, timeout=60)
        except Exception:  # an older agent, a node gone: the stacks stay, RAS is left out
            continue
        if isinstance(reply, dict) and reply.get("address"):
            if reply.get("ok"):
                return reply
            last = reply  # a port that did not answer as RAS: said, unless another does
    return last


def take_capture(
    fleet: Fleet,
    options: CaptureOptions | None = None,
    save: bool = True,
    sampled: Mapping[str, list[dict[str, Any]] | NodeFailure] | None = None,
    progress: Progress | None = None,
) -> StackCapture:
    """Capture, build and (before anyone sees it) save atomically to the data dir."""
    if save:
        return capture_and_analyse(fleet, options, sampled, progress).capture
    options = options or CaptureOptions()
    raw = capture_raw(fleet, options, sampled, progress)
    raw["id"] = new_capture_id()
    return build_capture(raw)


def capture_and_analyse(
    fleet: Fleet,
    options: CaptureOptions | None = None,
    sampled: Mapping[str, list[dict[str, Any]] | NodeFailure] | None = None,
    progress: Progress | None = None,
) -> AnalysedCapture:
    """Capture, build, analyse once, and save atomically before anyone sees it (a capture
    that found no rank at all is not saved: `save_error` says so).

    The analysis and diagnosis that made the saved file come back with the capture: the
    caller shows them, never analysing the capture again."""
    options = options or CaptureOptions()
    raw = capture_raw(fleet, options, sampled, progress)
    raw["id"] = new_capture_id()
    result = analysed(build_capture(raw))
    if not result.capture.rank_stacks:
        # No node answered, or no process with a rank: nothing to reopen or compare later,
        # and an empty entry in every list of saved captures.
        result.capture.save_error = f"not saved: {NOTHING_CAPTURED}"
        return result
    doc = result.json()
    if options.tags:
        doc["tags"] = list(options.tags)
    try:
        save_capture(result.capture, doc=doc)
    except (OSError, UserError) as exc:  # still show it: losing the save must not lose the capture
        result.capture.save_error = f"capture not saved: {exc}"
    return result
