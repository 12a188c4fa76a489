"""Launching, watching and verifying replay jobs on nodes, and the console's own job list.

The node keeps the authoritative record (its agent's `jobs` op); the console keeps a copy
of what it launched under `jobs_dir()` so a job on a node that dropped is still listed
(state "unknown", with its log path) and so a restarted console finds its jobs again.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_console.core import locations
from areal_console.core.client import AgentDisconnected, AgentError
from areal_console.core.fleet import NodeSession
from areal_console.core.replay import (
    TRAINER_FILE_NAME,
    DumpIndex,
    ReplayPlan,
    Verification,
    parse_metrics,
    trainer_hash,
    trainer_source,
    verify,
)

FINAL_STATES = ("finished", "failed", "stopped")


@dataclass
class JobRecord:
    """A job the console launched, as the console remembers it and last saw it."""

    job_id: str
    node: str
    plan: dict[str, Any]
    launched_at: float
    state: str = "running"
    exit_code: int | None = None
    log: str | None = None
    job_dir: str | None = None
    verification: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "node": self.node,
            "plan": self.plan,
            "launched_at": self.launched_at,
            "state": self.state,
            "exit_code": self.exit_code,
            "log": self.log,
            "job_dir": self.job_dir,
            "verification": self.verification,
            "error": self.error,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        known: dict[str, Any] = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def update_from_node(self, status: dict[str, Any]) -> None:
        self.state = str(status.get("state") or "unknown")
        self.exit_code = status.get("exit_code")
        self.log = status.get("log") or self.log
        self.job_dir = status.get("dir") or self.job_dir
        self.error = status.get("error")
        if status.get("argv"):
            self.extra["argv"] = list(status["argv"])  # with {job_dir} resolved by the node


def new_job_id(kind: str = "replay") -> str:
    return time.strftime(f"{kind}-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def save_job(record: JobRecord, directory: Path | None = None) -> Path:
    """Write the console's copy atomically."""
    root = directory or locations.jobs_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{record.job_id}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=1))
    os.replace(tmp, path)
    return path


def load_jobs(directory: Path | None = None) -> list[JobRecord]:
    """Every job the console remembers, newest first (unreadable files are skipped)."""
    root = directory or locations.jobs_dir()
    out = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            out.append(JobRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    out.sort(key=lambda r: r.launched_at or 0, reverse=True)
    return out


# --------------------------------------------------------------------------------------
# Talking to a node


def dump_index(session: NodeSession, path: str) -> DumpIndex:
    return DumpIndex.from_agent(session.call("replay_index", {"path": path}))


def stage_trainer(session: NodeSession) -> str:
    """The reference trainer's path on the node, sending it only when its hash is new there."""
    args: dict[str, Any] = {"name": TRAINER_FILE_NAME, "sha256": trainer_hash()}
    staged = session.call("stage_file", args)
    if not staged.get("present"):
        staged = session.call("stage_file", {**args, "source": trainer_source().decode()})
    return str(staged["path"])


def launch(session: NodeSession, plan: ReplayPlan, job_id: str | None = None) -> JobRecord:
    """Start the plan detached on its node and remember it."""
    job_id = job_id or new_job_id()
    status = session.call(
        "job_launch",
        {
            "job": job_id,
            "argv": plan.argv,
            "env": plan.env,
            "log": plan.log,
            "name": f"replay {plan.template} {plan.steps[0]}-{plan.steps[1]}",
            "meta": {"kind": "replay", "plan": plan.to_json()},
        },
    )
    record = JobRecord(job_id=job_id, node=plan.node, plan=plan.to_json(), launched_at=time.time())
    record.update_from_node(status)
    save_job(record)
    return record


def refresh(session: NodeSession, record: JobRecord) -> JobRecord:
    """The node's view of the job; a node that cannot answer makes the state "unknown"."""
    try:
        found = session.call("jobs", {"jobs": [record.job_id]}, timeout=15)["jobs"]
    except (AgentError, AgentDisconnected, OSError) as exc:
        record.state, record.error = "unknown", f"node {record.node} unreachable: {exc}"
        save_job(record)  # the log path and plan stay listed while the node is away
        return record
    if not found:
        record.state, record.error = "unknown", f"node {record.node} has no record of the job"
        save_job(record)
        return record
    record.update_from_node(found[0])
    save_job(record)
    return record


def wait(session: NodeSession, record: JobRecord, timeout: float, poll: float = 0.25) -> JobRecord:
    """Poll until the job ends (or `timeout` seconds pass: the state stays "running")."""
    deadline = time.monotonic() + timeout
    while True:
        refresh(session, record)
        if record.state in FINAL_STATES or record.state == "unknown":
            return record
        if time.monotonic() >= deadline:
            return record
        time.sleep(poll)


def read_metrics(session: NodeSession, path: str, job_dir: str | None) -> dict[int, dict[str, Any]]:
    if job_dir:
        path = path.replace("{job_dir}", job_dir)
    return parse_metrics(session.call("file_read", {"path": path})["text"])


def verify_job(session: NodeSession, record: JobRecord) -> Verification | None:
    """Compare the replay's metrics with the recording; None when the template has no metrics."""
    plan = record.plan
    if not plan.get("metrics") or not plan.get("recorded_metrics"):
        return None
    steps = (int(plan["steps"][0]), int(plan["steps"][1]))
    try:
        recorded = read_metrics(session, plan["recorded_metrics"], record.job_dir)
        replayed = read_metrics(session, plan["metrics"], record.job_dir)
    except (AgentError, AgentDisconnected, OSError) as exc:
        return Verification(
            False,
            [],
            {
                "step": steps[0],
                "metric": None,
                "recorded": None,
                "replayed": None,
                "reason": f"metrics unreadable: {exc}",
            },
        )
    result = verify(recorded, replayed, steps)
    record.verification = result.to_json()
    save_job(record)
    return result


def tail(session: NodeSession, job_id: str, lines: int = 50) -> list[str]:
    return list(session.call("job_tail", {"job": job_id, "lines": lines})["lines"])


def stop(session: NodeSession, record: JobRecord, grace: float = 10.0) -> JobRecord:
    status = session.call("job_stop", {"job": record.job_id, "grace": grace}, timeout=grace + 15)
    record.update_from_node(status)
    save_job(record)
    return record
