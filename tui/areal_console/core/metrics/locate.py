"""Which node holds a job's logs, and where: from its processes' command lines and the
files they write their output to."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.connection.records import ProcessRow, process_rows
from areal_console.core.metrics.logdir import log_dir_from_processes, run_identity


@dataclass(frozen=True)
class JobLogs:
    node: str
    path: str
    """The log directory (else the file the job's output goes to, else the tensorboard
    directory)."""
    processes: int
    owner: str | None = None
    """The job's user (the agent's, whose name the log directory carries): only files
    that user owns are read from it."""


def job_log(processes: Iterable[ProcessRow], user: str, match: str | None = None) -> str | None:
    """A job's log, as every view finds it (`h`, `b`, `metrics --job`, `report`): the AReaL
    log directory the command lines of its processes (those `match` selects) name, else
    the file they write their output to (`train.py > run.log`, the demo's trainer.log;
    only from `user`'s processes), else the tensorboard directory a command line names."""
    try:
        pattern = re.compile(match) if match else None
    except re.error as exc:
        raise UsageError(f"bad --job regex {match!r}: {exc}") from None
    chosen = [p for p in processes if pattern is None or pattern.search(p.cmdline)]
    cmdlines = [p.cmdline for p in chosen]
    found = log_dir_from_processes(cmdlines, user)
    if found:
        return found
    output = output_file(p.stdout for p in chosen if p.user in (None, user))
    if output:
        return output
    for cmd in cmdlines:
        tensorboard = run_identity(cmd).get("tensorboard")
        if tensorboard:
            return tensorboard
    return None


def output_file(paths: Iterable[str | None]) -> str | None:
    """The output file most of a job's processes share (a launcher and the ranks it
    started write to one log), the first seen on a tie."""
    counts = Counter(p for p in paths if p)
    return max(counts, key=lambda p: counts[p]) if counts else None


def find_job_logs(fleet: Fleet, match: str | None) -> tuple[NodeSession, JobLogs]:
    """The first node whose processes (matching `match`) name an AReaL log directory, or
    write their output to a file."""

    def look(session: NodeSession) -> tuple[str | None, int, str]:
        sample = session.call("sample", {"all": True}, timeout=30)
        procs = process_rows(sample.get("processes"))
        me = str(session.hello.get("user") or "")
        # A process names its own user's log directory (<fileroot>/logs/<its user>/...),
        # and only that user's files are read there: another user's process cannot steer
        # the console into this user's (or root's) runs. The agent's user's jobs first.
        by_user: dict[str, list[ProcessRow]] = {}
        for p in procs:
            by_user.setdefault(p.user or me, []).append(p)
        for user in [me, *sorted(set(by_user) - {me})]:
            found = job_log(by_user.get(user, []), user, match)
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
                    f"--experiment-name, --trial-name) or writes its output to a file"
                    f"{detail}; give the log path instead")  # fmt: skip


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
