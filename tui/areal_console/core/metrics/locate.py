"""Which node holds a job's AReaL logs, and where: from its processes' command lines."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.metrics.logdir import log_dir_from_processes, run_identity


@dataclass(frozen=True)
class JobLogs:
    node: str
    path: str
    """The log directory (or the tensorboard directory when only that is known)."""
    processes: int
    owner: str | None = None
    """The job's user (the agent's, whose name the log directory carries): only files
    that user owns are read from it."""


def job_logs_in(commands: Iterable[str], user: str, match: str | None) -> str | None:
    """The log directory named by the processes' command lines that `match` selects."""
    try:
        pattern = re.compile(match) if match else None
    except re.error as exc:
        raise UsageError(f"bad --job regex {match!r}: {exc}") from None
    cmdlines = [cmd for cmd in commands if pattern is None or pattern.search(cmd)]
    found = log_dir_from_processes(cmdlines, user)
    if found:
        return found
    for cmd in cmdlines:
        tensorboard = run_identity(cmd).get("tensorboard")
        if tensorboard:
            return tensorboard
    return None


def find_job_logs(fleet: Fleet, match: str | None) -> tuple[NodeSession, JobLogs]:
    """The first node whose processes (matching `match`) name an AReaL log directory."""

    def look(session: NodeSession) -> tuple[str | None, int, str]:
        sample = session.call("sample", {"all": True}, timeout=30)
        procs = sample.get("processes", [])
        me = str(session.hello.get("user") or "")
        # A process names its own user's log directory (<fileroot>/logs/<its user>/...),
        # and only that user's files are read there: another user's process cannot steer
        # the console into this user's (or root's) runs. The agent's user's jobs first.
        by_user: dict[str, list[str]] = {}
        for p in procs:
            by_user.setdefault(str(p.get("user") or me), []).append(str(p.get("cmdline") or ""))
        for user in [me, *sorted(set(by_user) - {me})]:
            found = job_logs_in(by_user.get(user, []), user, match)
            if found:
                return found, len(procs), user
        return None, len(procs), me

    results = fleet.fan_out(look)
    errors = []
    for session in fleet:
        result = results.get(session.name)
        if isinstance(result, NodeFailure):
            errors.append(f"{session.name}: {result.error}")
            continue
        if result and result[0]:
            return session, JobLogs(session.name, result[0], result[1], result[2] or None)
    what = f"matching {match!r} " if match else ""
    detail = f" ({'; '.join(errors)})" if errors else ""
    raise UserError(f"no process {what}names an AReaL log directory (--fileroot, "
                    f"--experiment-name, --trial-name){detail}; give the log path instead")  # fmt: skip


@dataclass(frozen=True)
class HealthTarget:
    """What the Health view follows: a path (on `node`, or here), or the job `match` selects."""

    path: str | None = None
    node: str | None = None
    match: str | None = None
    owner: str | None = None  # the job's user: only that user's files are read (--areal)

    def describe(self) -> str:
        if self.path:
            return f"{self.node}:{self.path}" if self.node else self.path
        return f"the job matching {self.match!r}" if self.match else "no run"
