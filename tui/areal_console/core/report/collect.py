"""Gathering a report's parts from a job's nodes (or, for a job that is gone, from a saved
capture and the log directory). Each part that cannot be had is named in `missing` with
why; nothing here raises for a part that failed."""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from areal_node import versions as node_versions_module
from areal_node.versions import node_versions

from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import strip_ansi
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.connection.records import process_rows
from areal_console.core.metrics.follow import (
    FileAccess,
    LocalFiles,
    MetricsFollower,
    NodeFiles,
)
from areal_console.core.metrics.health import HealthThresholds
from areal_console.core.metrics.locate import job_log
from areal_console.core.metrics.report import report_json
from areal_console.core.report.model import LogTail, NodeVersions, ReportInputs
from areal_console.core.stacks.records import now_iso

EXTENSION_NAME = "report_versions"
# The reader reaches a node inside the payload its agent runs from (the `load` op imports it).
VERSIONS_MODULE = node_versions_module.__name__
LOG_TAIL_LINES = 200
LOG_BUNDLE_BYTES = 1 << 20
MAX_LOGS = 12
CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Where:
    """Files on one node (or here), and the node's name and user."""

    node: str
    files: FileAccess
    user: str


def job_processes(capture: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The capture's processes without their stacks (ranks, controller, launcher, servers)."""
    out = []
    for r in (capture or {}).get("ranks") or []:
        if isinstance(r, dict):
            out.append({k: v for k, v in r.items() if k not in ("threads",)})
    return out


def log_of_job(processes: list[dict[str, Any]], user: str, node: str | None) -> str | None:
    """The job's log on `node` (`job_log`): the directory its command lines name, else the
    file its processes on that node write their output to."""
    rows = process_rows([p if p.get("node") == node else {**p, "stdout": None}
                         for p in processes])  # fmt: skip
    return job_log(rows, user)


def read_tail(files: FileAccess, path: str, node: str) -> LogTail:
    """The last `LOG_BUNDLE_BYTES` of a log (whole lines), and its last lines."""
    first = files.read(path, 0, None, 1)
    size = int(first["size"])
    start = max(0, size - LOG_BUNDLE_BYTES)
    data = files.read(path, start, first["ident"], LOG_BUNDLE_BYTES)["data"]
    text = bytes(data).decode("utf-8", "replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    text = strip_ansi(text)
    lines = text.splitlines()[-LOG_TAIL_LINES:]
    return LogTail(node, path, lines, text, size, str(first.get("ident") or ""))


@dataclass
class NodeLogs:
    """What one node's copy of the log directory gave: its logs' tails, and what failed."""

    where: Where
    path: str
    kind: str = "dir"
    tails: list[LogTail] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    names: int = 0
    """How many *.log files the directory lists there."""


def read_node_logs(where: Where, path: str) -> NodeLogs | str:
    """The tails of the role logs in one node's log directory (role logs first; merged.log
    repeats them, so it comes last); why not, as text, when the node has no such path."""
    try:
        found = where.files.find(path)
    except UserError as exc:
        return str(exc)
    logs = list(found.get("logs") or [])
    logs.sort(key=lambda p: (os.path.basename(p) == "merged.log", p))
    out = NodeLogs(where, path, str(found.get("kind") or "dir"), names=len(logs))
    for log in logs[:MAX_LOGS]:
        try:
            out.tails.append(read_tail(where.files, log, where.node))
        except (UserError, KeyError, OSError) as exc:
            out.errors[f"log {where.node}:{log}"] = str(exc)
    if len(logs) > MAX_LOGS:
        out.errors[f"logs on {where.node}"] = (
            f"{len(logs) - MAX_LOGS} of {len(logs)} *.log files in {path} not read "
            f"(at most {MAX_LOGS} a node)"
        )
    return out


def same_file(a: LogTail, b: LogTail) -> bool:
    """One file seen from two nodes (a log directory on a shared file system): the same
    path and inode, and the tail read first is the end of, or inside, the one read later
    (a live log grows between the two reads)."""
    if a.path != b.path or a.ident.split(":")[-1] != b.ident.split(":")[-1]:
        return False
    shorter, longer = sorted((a.text, b.text), key=len)
    return shorter[-4096:] in longer


def merge_node_logs(found: list[NodeLogs]) -> list[LogTail]:
    """Every node's tails, a file that several nodes share once (its newest read, naming
    every node that sees it), in the order the nodes were read."""
    merged: list[LogTail] = []
    for node_logs in found:
        for tail in node_logs.tails:
            i = next((i for i, t in enumerate(merged) if same_file(t, tail)), None)
            if i is None:
                merged.append(tail)
                continue
            seen = merged[i]
            newer = tail if len(tail.text) > len(seen.text) else seen
            merged[i] = replace(newer, node=seen.node, also=(*seen.also, tail.node))
    return merged


def read_logs(places: list[tuple[Where, str]], inputs: ReportInputs, fleet: Fleet | None) -> None:
    """The log directory's files on every node that has it (each node's role logs; a
    directory shared between nodes once), and its config.yaml and metrics from the first
    node that has it (the controller's: AReaL writes config.yaml there)."""
    results = _on_each(fleet, places)
    found = [r for r in results if isinstance(r, NodeLogs)]
    if not found:
        why = "; ".join(f"{w.node}: {r}" for (w, _), r in zip(places, results, strict=True))
        inputs.missing["logs"] = why or "no node has the log directory"
        for part in ("config", "metrics"):
            inputs.missing[part] = "the log directory was not found on any node"
        return
    inputs.log_dir = found[0].path
    inputs.log_nodes = [f.where.node for f in found]
    for f in found:
        inputs.missing.update(f.errors)
    inputs.logs = merge_node_logs(found)
    if not inputs.logs:
        inputs.missing["logs"] = "no *.log file in " + ", ".join(
            f"{f.where.node}:{f.path}" for f in found
        )
    first = found[0]
    where, path = first.where, first.path
    base = path if first.kind == "dir" else os.path.dirname(path)
    config = os.path.join(base, "config.yaml")
    try:
        result = where.files.read(config, 0, None, CONFIG_BYTES)
        inputs.config_path = f"{where.node}:{config}"
        inputs.config_text = bytes(result["data"]).decode("utf-8", "replace")
    except (UserError, KeyError, OSError) as exc:
        inputs.missing["config"] = f"no config.yaml in the log directory ({exc})"
    try:
        follower = MetricsFollower(path, where.files, HealthThresholds())
        try:
            follower.poll()
            inputs.metrics = report_json(follower.report())
        finally:
            follower.close()
    except (UserError, KeyError, OSError, ValueError) as exc:
        inputs.missing["metrics"] = str(exc)


def _on_each(fleet: Fleet | None, places: list[tuple[Where, str]]) -> list[NodeLogs | str]:
    """`read_node_logs` at every place, the nodes in parallel."""
    if fleet is None:
        return [read_node_logs(w, p) for w, p in places]
    by_name = {w.node: (w, p) for w, p in places}
    sessions = [fleet.session(name) for name in by_name]
    answers = fleet.fan_out(lambda s: read_node_logs(*by_name[s.name]), sessions)
    return [
        f"cannot read: {a.error}" if isinstance(a, NodeFailure) else a
        for a in (answers[w.node] for w, _ in places)
    ]


def versions_of(session: NodeSession | None, pids: list[int], executable: str | None) -> Any:
    """The `versions` answer of a node: here, by calling the reader directly; on a node,
    through its agent (the agent's `load` op imports the reader from its payload)."""
    if session is None or session.spec.transport == "local":
        return node_versions(pids, executable)
    if "versions" not in (session.hello.get("ops") or []):
        session.call("load", {"name": EXTENSION_NAME, "module": VERSIONS_MODULE}, timeout=30)
    return session.call("versions", {"pids": pids, "executable": executable}, timeout=60)


def _gpu_names(session: NodeSession) -> list[str]:
    sample = session.call("sample", {"all": False, "cpu": False, "gpus": True}, timeout=30)
    return [str(g.get("name")) for g in sample.get("gpus") or [] if g.get("name")]


def collect_versions(
    fleet: Fleet | None, processes: list[dict[str, Any]], inputs: ReportInputs
) -> None:
    """Each node's versions, read from the interpreters of the job's processes there."""
    by_node: dict[str, list[int]] = {}
    for p in processes:
        if p.get("state", "ok") == "ok" and p.get("pid") and (
            p.get("rank") is not None or p.get("role") in ("controller", "launcher", "sglang",
                                                            "vllm")
        ):  # fmt: skip
            by_node.setdefault(str(p.get("node")), []).append(int(p["pid"]))
    executable = _executable(processes)
    if fleet is None:  # a job that is gone: this machine's interpreter that ran it
        answer = node_versions([], executable)
        inputs.versions.append(
            NodeVersions("local", answer["system"], answer["interpreters"], gone=True)
        )
        return

    def one(session: NodeSession) -> NodeVersions:
        answer = versions_of(session, by_node.get(session.name, []), executable)
        try:
            gpus = _gpu_names(session)
        except Exception:  # NVML absent: /proc/driver/nvidia named the models already
            gpus = []
        gone = not by_node.get(session.name)
        return NodeVersions(session.name, answer["system"], answer["interpreters"], gpus, gone)

    sessions = [s for s in fleet if s.name in by_node] or list(fleet)
    results = fleet.fan_out(one, sessions)
    failed = []
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            failed.append(f"{name}: {result.error}")
        else:
            inputs.versions.append(result)
    if failed:
        inputs.missing["versions"] = "; ".join(failed)


def _executable(processes: list[dict[str, Any]]) -> str | None:
    """The interpreter a rank was started with (argv[0] of its command line)."""
    for p in processes:
        if p.get("rank") is None:
            continue
        try:
            argv = shlex.split(str(p.get("cmdline") or ""))
        except ValueError:
            argv = str(p.get("cmdline") or "").split()
        if argv and "python" in os.path.basename(argv[0]) and os.path.isabs(argv[0]):
            return argv[0]
    return None


# Takes (or makes) the capture: (stacks document, where it came from, why there is none).
CaptureSource = Callable[[], tuple[dict[str, Any] | None, str, str | None]]


@dataclass
class ReportRequest:
    """What to report on: a capture (taken already, or `take` one), and where the logs are."""

    job: str | None = None
    capture: dict[str, Any] | None = None
    capture_note: str = ""
    log_path: str | None = None
    log_node: str | None = None
    """The node whose log directory is read first (config.yaml and metrics from it)."""
    only_log_node: bool = False
    """Read the log directory on `log_node` only, not on every node that has it."""


def collect(
    fleet: Fleet | None,
    request: ReportRequest,
    take_capture: CaptureSource | None = None,
) -> ReportInputs:
    """Every part of the report; the capture is the request's, else `take_capture`'s."""
    inputs = ReportInputs(job=request.job, made_at=now_iso())
    inputs.capture, inputs.capture_note = request.capture, request.capture_note
    if inputs.capture is None and take_capture is not None:
        capture, note, why = take_capture()
        inputs.capture, inputs.capture_note = capture, note
        if capture is None:
            inputs.missing["stacks"] = why or "no capture"
    elif inputs.capture is None:
        inputs.missing["stacks"] = "no capture taken or saved"
    if inputs.capture is not None and not inputs.job:
        inputs.job = inputs.capture.get("job")
    inputs.processes = job_processes(inputs.capture)
    places = _log_places(fleet, request, inputs)
    if places:
        read_logs(places, inputs, fleet)
    elif request.only_log_node and fleet is not None:
        for part in ("logs", "config", "metrics"):
            inputs.missing[part] = f"the node {request.log_node} is not one of the targets"
    for part in ("logs", "config", "metrics"):
        if not places and part not in inputs.missing:
            inputs.missing[part] = (
                "the log directory is not known (no --fileroot/--experiment-name/--trial-name "
                "in the job's command lines, and no output file): give it with --logs"
            )
    try:
        collect_versions(fleet, inputs.processes, inputs)
    except (UserError, OSError, KeyError, ValueError) as exc:
        inputs.missing["versions"] = str(exc)
    return inputs


def _log_places(
    fleet: Fleet | None, request: ReportRequest, inputs: ReportInputs
) -> list[tuple[Where, str]]:
    """The run's log directory on each node (the controller's node or `--node` first): the
    path given, else the one the job's command lines name (with each node's user). Every
    node is asked: AReaL's workers write `<role>.log` where they run, so a job without a
    shared file system has a directory per node. A directory found from the job's command
    lines is read as its user's: a config.yaml or log another user planted there is not
    the run's (a path given with --logs is read as it is)."""
    out = []
    for where in _places(fleet, request, inputs, owned=not request.log_path):
        if request.only_log_node and where.node != request.log_node:
            continue
        path = request.log_path or log_of_job(inputs.processes, where.user, where.node)
        if path is not None:
            out.append((where, path))
    return out


def _places(
    fleet: Fleet | None, request: ReportRequest, inputs: ReportInputs, owned: bool
) -> list[Where]:
    if fleet is None:
        user = _local_user()
        return [Where("local", LocalFiles(user if owned else None), user)]
    order = [s.name for s in fleet]
    controller = [str(p.get("node")) for p in inputs.processes
                  if p.get("role") in ("controller", "launcher")]  # fmt: skip
    first = [request.log_node] if request.log_node else controller
    names = list(dict.fromkeys([*first, *order]))
    out = []
    for name in names:
        try:
            session = fleet.session(name)
        except KeyError:
            continue
        user = str(session.hello.get("user") or _local_user())
        owner = user if owned else None
        files: FileAccess = (
            LocalFiles(owner) if session.spec.transport == "local" else NodeFiles(session, owner)
        )
        out.append(Where(name, files, user))
    return out


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
