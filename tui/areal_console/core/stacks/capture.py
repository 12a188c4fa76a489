"""Capture every rank's stack on every node at once, through the fleet's agents.

Per node, in parallel across nodes: one `sample` picks the job's processes, then `pyspy`
dumps all of them in parallel (the agent runs one py-spy per PID), `samples` times. The
result is a raw capture (see `model.py`) turned into a `StackCapture` and saved.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.nodes import count_areal_world_sizes
from areal_console.core.stacks.model import StackCapture, build_capture, now_iso
from areal_console.core.stacks.store import new_capture_id, save_capture

# Roles of non-rank processes that belong to a job and are worth a stack: launchers,
# inference servers, AReaL's single-controller controller and its non-training workers.
JOB_ROLES = frozenset(
    {
        "launcher",
        "sglang",
        "vllm",
        "rpc_server",
        "controller",
        "rollout",
        "eval-rollout",
        "data",
        "proxy-rollout",
    }
)

Progress = Callable[[str], None]


@dataclass
class CaptureOptions:
    samples: int = 1
    interval: float = 1.0
    match: str | None = None  # regex on the command line
    timeout: float = 15.0  # per py-spy run
    nonblocking: bool = False
    native: bool = False  # py-spy --native: C/C++ frames too (NCCL under a collective)
    with_locals: bool = False  # py-spy --locals: each frame's variables
    # Set to stop between samples (Ctrl-C): what was sampled so far is kept.
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    progress: Progress | None = field(default=None, compare=False, repr=False)
    ledger: bool = True  # also read Flight Recorder traces (the collective ledger)

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


def select_job_processes(
    processes: list[dict[str, Any]], match: str | None = None
) -> list[dict[str, Any]]:
    """Ranks, their launcher (the ranks' Python parent) and known job servers."""
    pattern = re.compile(match) if match else None

    def wanted(p: dict[str, Any]) -> bool:
        return pattern is None or bool(pattern.search(str(p.get("cmdline") or "")))

    by_pid = {p["pid"]: p for p in processes}
    chosen: dict[int, dict[str, Any]] = {}
    for p in processes:
        if p.get("rank") is not None and wanted(p):
            chosen[p["pid"]] = p
    for p in list(chosen.values()):
        parent = by_pid.get(p.get("ppid"))
        if parent is None or parent["pid"] in chosen or parent.get("rank") is not None:
            continue
        if parent.get("role") == "wrapper":
            continue  # a shell around the rank: dumping it would dump the rank again
        if "python" in str(parent.get("cmdline") or "") or parent.get("role") == "launcher":
            chosen[parent["pid"]] = dict(parent, role=parent.get("role") or "launcher")
    for p in processes:
        if p["pid"] not in chosen and p.get("role") in JOB_ROLES and wanted(p):
            chosen[p["pid"]] = p
    # The rest of a chosen AReaL job (experiment/trial): its servers and controller, whose
    # command lines need not match.
    jobs = {p.get("job") for p in chosen.values()} - {None}
    for p in processes:
        if p["pid"] not in chosen and p.get("job") in jobs and p.get("role") in JOB_ROLES:
            chosen[p["pid"]] = p
    return sorted(chosen.values(), key=lambda p: p["pid"])


def capture_node(session: NodeSession, options: CaptureOptions) -> dict[str, Any]:
    """Raw capture of one node: its job processes and `samples` rounds of dumps."""
    sample = session.call("sample", {"all": True}, timeout=30)
    procs = select_job_processes(sample.get("processes", []), options.match)
    node: dict[str, Any] = {"node": session.name, "error": None, "processes": procs, "samples": []}
    pids = [p["pid"] for p in procs]
    if not pids:
        return node
    args = {"pids": pids, "timeout": options.timeout, "nonblocking": options.nonblocking,
            "native": options.native, "locals": options.with_locals}  # fmt: skip
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
        if options.progress is not None and options.samples > 1:
            options.progress(f"{session.name}: sample {i + 1}/{options.samples}")
    if options.ledger:
        node["fr"] = fr_traces(session, procs)
    return node


def fr_traces(session: NodeSession, procs: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's Flight Recorder traces (live and dump files), or why there are none."""
    pids = [p["pid"] for p in procs if p.get("rank") is not None]
    try:
        return session.call("fr_traces", {"pids": pids, "timeout": 5.0}, timeout=60)
    except Exception as exc:  # an older agent, a node gone: the ledger says so, stacks stay
        return {"error": f"Flight Recorder traces not read: {exc}"}


def capture_raw(fleet: Fleet, options: CaptureOptions) -> dict[str, Any]:
    """All nodes in parallel; a node that fails becomes an error entry, not an exception."""
    started = now_iso()
    results = fleet.fan_out(lambda s: capture_node(s, options))
    nodes: list[dict[str, Any]] = []
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            nodes.append({"node": name, "error": result.error, "processes": [], "samples": []})
        else:
            nodes.append(result)
    count_areal_world_sizes(n["processes"] for n in nodes)
    return {"captured_at": started, "interval": options.interval, "nodes": nodes}


def take_capture(
    fleet: Fleet, options: CaptureOptions | None = None, save: bool = True
) -> StackCapture:
    """Capture, build and (before anyone sees it) save atomically to the data dir."""
    options = options or CaptureOptions()
    raw = capture_raw(fleet, options)
    raw["id"] = new_capture_id()
    capture = build_capture(raw)
    if save:
        try:
            save_capture(capture)
        except OSError as exc:  # still show it: losing the save must not lose the capture
            capture.save_error = f"capture not saved: {exc}"
    return capture
