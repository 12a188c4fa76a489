"""Gathering a report's parts from a job's nodes (or, for a job that is gone, from a saved
capture and the log directory). Each part that cannot be had is named in `missing` with
why; nothing here raises for a part that failed."""

from __future__ import annotations

import getpass
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal_node import versions as node_versions_module
from areal_node.versions import node_versions

from areal_console.core.common.errors import UserError
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.metrics.follow import (
    FileAccess,
    LocalFiles,
    MetricsFollower,
    NodeFiles,
)
from areal_console.core.metrics.health import HealthThresholds
from areal_console.core.metrics.logdir import log_dir_from_processes
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


def log_dir_of_job(processes: list[dict[str, Any]], user: str) -> str | None:
    return log_dir_from_processes([str(p.get("cmdline") or "") for p in processes], user)


def read_tail(files: FileAccess, path: str, node: str) -> LogTail:
    """The last `LOG_BUNDLE_BYTES` of a log (whole lines), and its last lines."""
    first = files.read(path, 0, None, 1)
    size = int(first["size"])
    start = max(0, size - LOG_BUNDLE_BYTES)
    data = files.read(path, start, first["ident"], LOG_BUNDLE_BYTES)["data"]
    text = bytes(data).decode("utf-8", "replace")
    if start > 0 and "\n" in text:
        text = text.split("\n", 1)[1]
    text = _strip_ansi(text)
    return LogTail(node, path, text.splitlines()[-LOG_TAIL_LINES:], text, size)


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def read_logs(where: Where, path: str, inputs: ReportInputs) -> None:
    """Every log of the run's directory (role logs first; merged.log repeats them, so it
    comes last), its config.yaml, and its metrics."""
    try:
        found = where.files.find(path)
    except UserError as exc:
        inputs.missing["logs"] = str(exc)
        return
    logs = list(found.get("logs") or [])
    logs.sort(key=lambda p: (os.path.basename(p) == "merged.log", p))
    for log in logs[:MAX_LOGS]:
        try:
            inputs.logs.append(read_tail(where.files, log, where.node))
        except (UserError, KeyError, OSError) as exc:
            inputs.missing[f"log {log}"] = str(exc)
    if not logs:
        inputs.missing["logs"] = f"no *.log file in {path}"
    base = path if found.get("kind") == "dir" else os.path.dirname(path)
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
        inputs.versions.append(NodeVersions("local", answer["system"], answer["interpreters"]))
        return

    def one(session: NodeSession) -> NodeVersions:
        answer = versions_of(session, by_node.get(session.name, []), executable)
        try:
            gpus = _gpu_names(session)
        except Exception:  # NVML absent: /proc/driver/nvidia named the models already
            gpus = []
        return NodeVersions(session.name, answer["system"], answer["interpreters"], gpus)

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
    where = _log_place(fleet, request, inputs)
    if where is not None:
        inputs.log_dir = f"{where[0].node}:{where[1]}" if fleet is not None else where[1]
        read_logs(where[0], where[1], inputs)
    for part in ("logs", "config", "metrics"):
        if where is None and part not in inputs.missing:
            inputs.missing[part] = (
                "the log directory is not known (no --fileroot/--experiment-name/--trial-name "
                "in the job's command lines): give it with --logs"
            )
    try:
        collect_versions(fleet, inputs.processes, inputs)
    except (UserError, OSError, KeyError, ValueError) as exc:
        inputs.missing["versions"] = str(exc)
    return inputs


def _log_place(
    fleet: Fleet | None, request: ReportRequest, inputs: ReportInputs
) -> tuple[Where, str] | None:
    """Which node holds the run's log directory, and its path."""
    # A directory found from the job's command lines is read as its user's: a config.yaml
    # or log another user planted there is not the run's (a path given with --logs is
    # read as it is).
    places = _places(fleet, request, inputs, owned=not request.log_path)
    if request.log_path:
        return (places[0], request.log_path) if places else None
    for where in places:
        path = log_dir_of_job(inputs.processes, where.user)
        if path is None:
            return None
        try:
            where.files.find(path)
        except UserError:
            continue
        return where, path
    return None


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
