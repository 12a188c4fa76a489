"""Launching, watching and verifying replay runs on nodes, and the console's own job list.

The node keeps the authoritative record (its agent's `jobs` op); the console keeps a copy
of what it launched under `jobs_dir()` so a job on a node that dropped is still listed
(state "unknown", with its log path) and so a restarted console finds its jobs again.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_console.core.common import locations, private_files
from areal_console.core.common.identity import login_user
from areal_console.core.connection.client import AgentDisconnected, AgentError
from areal_console.core.connection.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.connection.payload import node_payload
from areal_console.core.replay.plan import (
    TRAINER_FILE_NAME,
    DumpIndex,
    ReplayPlan,
    Verification,
    parse_metrics,
    resolve,
    verify,
)
from areal_console.core.replay.python import CHECK_KIND
from areal_console.core.replay.verify import verification_from_json, verify_changed_run

FINAL_STATES = ("finished", "failed", "stopped")


@dataclass
class RunRecord:
    """A job the console launched, as the console remembers it and last saw it.

    `plan` stays the plan's JSON as it was saved and sent to the node (a node's own job
    may carry a partial one); the screens read it through the typed properties below.
    """

    job_id: str
    node: str
    plan: dict[str, Any]
    launched_at: float
    state: str = "running"
    exit_code: int | None = None
    log: str | None = None
    job_dir: str | None = None
    verification: Verification | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    slurm_job: str | None = None  # launched through Slurm: its job id (sbatch or the host job)
    slurm_step: str | None = None  # a step in a running job (`srun --overlap`): "JOB.STEP"
    user: str | None = None  # who launched it (login identity); None: an older record

    def __post_init__(self) -> None:
        saved: Any = self.verification
        if saved is not None and not isinstance(saved, Verification):
            self.verification = verification_from_json(saved)  # as a record file holds it
        if self.user is not None and not isinstance(self.user, str):
            self.user = None

    @property
    def steps(self) -> tuple[int, int] | None:
        """The plan's first and last step."""
        steps = self.plan.get("steps")
        if isinstance(steps, list | tuple) and len(steps) == 2:
            first, last = steps
            if isinstance(first, int) and isinstance(last, int):
                return (first, last)
        return None

    @property
    def gpus(self) -> tuple[int, ...]:
        """The plan's GPUs (none: CPU, or a plan that does not say)."""
        gpus = self.plan.get("gpus")
        return tuple(g for g in gpus if isinstance(g, int)) if isinstance(gpus, list) else ()

    @property
    def overrides(self) -> list[str]:
        """The user's `key=value` overrides: a changed run, not a reproduction."""
        saved = self.extra.get("overrides")
        return [str(o) for o in saved] if isinstance(saved, list) else []

    @property
    def verifiable(self) -> bool:
        """The plan writes metrics: a finished job is compared with its recording."""
        return bool(self.plan.get("metrics"))

    @property
    def argv(self) -> tuple[str, ...]:
        """The command as the node ran it (`{job_dir}` resolved); () until a node said."""
        argv = self.extra.get("argv")
        return tuple(map(str, argv)) if isinstance(argv, list) else ()

    @property
    def command(self) -> tuple[str, ...]:
        """The command as run, else as planned."""
        planned = self.plan.get("argv")
        return self.argv or (tuple(map(str, planned)) if isinstance(planned, list) else ())

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
            "verification": None if self.verification is None else self.verification.to_json(),
            "error": self.error,
            "extra": self.extra,
            "slurm_job": self.slurm_job,
            "slurm_step": self.slurm_step,
            "user": self.user,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        known: dict[str, Any] = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @property
    def slurm_label(self) -> str:
        """ "slurm job 12" / "slurm step 12.3" with Slurm's last known state, or ""."""
        if not self.slurm_job:
            return ""
        what = f"step {self.slurm_step}" if self.slurm_step else f"job {self.slurm_job}"
        state = self.extra.get("slurm_state")
        return f"slurm {what}" + (f" {state}" if state else "")

    def update_from_node(self, status: dict[str, Any]) -> None:
        self.state = str(status.get("state") or "unknown")
        self.exit_code = status.get("exit_code")
        self.log = status.get("log") or self.log
        self.job_dir = status.get("dir") or self.job_dir
        self.error = status.get("error")
        if status.get("argv"):
            self.extra["argv"] = list(status["argv"])  # with {job_dir} resolved by the node


def merge_runs(
    known: list[RunRecord], node_jobs: dict[str, list[dict[str, Any]] | str]
) -> list[RunRecord]:
    """The console's records updated from each node's answer (a string: the node's error)."""
    by_key = {(r.node, r.job_id): r for r in known}
    for node, answer in node_jobs.items():
        if isinstance(answer, str):
            for r in by_key.values():
                if r.node == node and r.state == "running":
                    r.state, r.error = "unknown", f"node {node} unreachable: {answer}"
            continue
        for status in answer:
            meta = status.get("meta")
            if isinstance(meta, dict) and meta.get("kind") == CHECK_KIND:
                continue  # a replay's interpreter check (replay_python.py), not a run
            key = (node, str(status.get("job")))
            record = by_key.get(key)
            if record is None:
                plan = meta.get("plan") if isinstance(meta, dict) else None
                user = meta.get("user") if isinstance(meta, dict) else None
                record = RunRecord(
                    job_id=key[1],
                    node=node,
                    plan=dict(plan) if isinstance(plan, dict) else {},
                    launched_at=float(status.get("started") or 0),
                    user=user if isinstance(user, str) else None,
                )
                by_key[key] = record
            record.update_from_node(status)
    for r in by_key.values():
        if r.node not in node_jobs and r.state == "running" and not r.slurm_job:
            r.state, r.error = "unknown", f"node {r.node} is not connected"
    # Newest first; launch time alone is not a total order (records from a node without
    # it read 0), so ties go by node and job id and the order survives a restart.
    return sorted(by_key.values(), key=lambda r: (-(r.launched_at or 0), r.node, r.job_id))


def node_jobs(fleet: Fleet, timeout: float = 15.0) -> dict[str, list[dict[str, Any]] | str]:
    """Every connected node's job records (its agent's `jobs` op), or why it did not answer."""
    answers: dict[str, list[dict[str, Any]] | str] = {}
    for node, result in fleet.call_all("jobs", timeout=timeout).items():
        answers[node] = result.error if isinstance(result, NodeFailure) else list(result["jobs"])
    return answers


def new_run_id(kind: str = "replay") -> str:
    return time.strftime(f"{kind}-%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def save_run(record: RunRecord, directory: Path | None = None) -> Path:
    """Write the console's copy atomically."""
    root = directory or locations.jobs_dir()
    return private_files.replace(
        root / f"{record.job_id}.json", json.dumps(record.to_json(), indent=1)
    )


def load_runs(directory: Path | None = None) -> list[RunRecord]:
    """Every job the console remembers, newest first (unreadable files are skipped)."""
    root = directory or locations.jobs_dir()
    out = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        try:
            out.append(RunRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    out.sort(key=lambda r: r.launched_at or 0, reverse=True)
    return out


# --------------------------------------------------------------------------------------
# Talking to a node


def dump_index(session: NodeSession, path: str) -> DumpIndex:
    return DumpIndex.from_agent(session.call("replay_index", {"path": path}))


def stage_trainer(session: NodeSession) -> str:
    """The reference trainer's path on the node: the node payload, staged under the
    trainer's name and sent only when its hash is new there."""
    payload = node_payload()
    args: dict[str, Any] = {"name": TRAINER_FILE_NAME, "sha256": payload.sha256}
    staged = session.call("stage_file", args)
    if not staged.get("present"):
        data = base64.b64encode(payload.data).decode("ascii")
        staged = session.call("stage_file", {**args, "data": data})
    return str(staged["path"])


def launch(
    session: NodeSession,
    plan: ReplayPlan,
    job_id: str | None = None,
    overrides: list[str] | None = None,
) -> RunRecord:
    """Start the plan detached on its node and remember it (with who launched it, and the
    user's `overrides`, which make it a changed run)."""
    job_id = job_id or new_run_id()
    status = session.call(
        "job_launch",
        {
            "job": job_id,
            "argv": plan.argv,
            "env": plan.env,
            "log": plan.log,
            "name": f"replay {plan.template} {plan.steps[0]}-{plan.steps[1]}",
            # Who launched it: another console on this node lists it as that user's.
            "meta": {"kind": "replay", "plan": plan.to_json(), "user": login_user()},
        },
    )
    record = RunRecord(
        job_id=job_id,
        node=plan.node,
        plan=plan.to_json(),
        launched_at=time.time(),
        extra={"overrides": list(overrides)} if overrides else {},
        user=login_user(),
    )
    record.update_from_node(status)
    save_run(record)
    return record


def refresh(session: NodeSession, record: RunRecord) -> RunRecord:
    """The node's view of the job; a node that cannot answer makes the state "unknown"."""
    try:
        found = session.call("jobs", {"jobs": [record.job_id]}, timeout=15)["jobs"]
    except (AgentError, AgentDisconnected, OSError) as exc:
        record.state, record.error = "unknown", f"node {record.node} unreachable: {exc}"
        save_run(record)  # the log path and plan stay listed while the node is away
        return record
    if not found:
        record.state, record.error = "unknown", f"node {record.node} has no record of the job"
        save_run(record)
        return record
    record.update_from_node(found[0])
    save_run(record)
    return record


def wait(
    session: NodeSession,
    record: RunRecord,
    timeout: float,
    poll: float = 0.25,
    on_poll: Callable[[RunRecord], None] | None = None,
) -> RunRecord:
    """Poll until the job ends (or `timeout` seconds pass: the state stays "running");
    `on_poll` sees the record after each poll (to show progress)."""
    deadline = time.monotonic() + timeout
    while True:
        refresh(session, record)
        if record.state in FINAL_STATES or record.state == "unknown":
            return record
        if on_poll is not None:
            on_poll(record)
        if time.monotonic() >= deadline:
            return record
        time.sleep(poll)


def read_metrics(session: NodeSession, path: str, job_dir: str | None) -> dict[int, dict[str, Any]]:
    path = resolve(path, job_dir or None)
    return parse_metrics(session.call("file_read", {"path": path})["text"])


def verify_run(session: NodeSession, record: RunRecord) -> Verification | None:
    """Compare the replay's metrics with the recording; None when the template has no metrics."""
    plan = record.plan
    if not plan.get("metrics") or not plan.get("recorded_metrics"):
        return None
    steps = (int(plan["steps"][0]), int(plan["steps"][1]))

    def cannot(reason: str) -> Verification:
        mismatch = {"step": steps[0], "metric": None, "recorded": None, "replayed": None,
                    "reason": reason}  # fmt: skip
        return Verification(False, [], mismatch, comparable=False)

    # Unreadable recorded metrics (the recording was deleted or moved) leave nothing to
    # compare with: that is not a replay that differs.
    try:
        recorded = read_metrics(session, plan["recorded_metrics"], record.job_dir)
    except (AgentError, AgentDisconnected, OSError) as exc:
        result = cannot(f"the recording's metrics are unreadable ({exc})")
    else:
        try:
            replayed = read_metrics(session, plan["metrics"], record.job_dir)
        except (AgentError, AgentDisconnected, OSError) as exc:
            result = Verification(False, [], {"step": steps[0], "metric": None, "recorded": None,
                                              "replayed": None,
                                              "reason": f"replay metrics unreadable: {exc}"})  # fmt: skip
        else:
            tolerance = plan.get("tolerance")
            if record.overrides:  # a changed run: only what the overrides leave unchanged
                template = str(plan.get("template") or "")
                result = verify_changed_run(
                    recorded, replayed, steps, template, record.overrides, rel_tol=tolerance
                )
            else:
                result = verify(recorded, replayed, steps, rel_tol=tolerance)
    record.verification = result
    save_run(record)
    return result


def tail(session: NodeSession, job_id: str, lines: int = 50) -> list[str]:
    return list(session.call("job_tail", {"job": job_id, "lines": lines})["lines"])


def stop(session: NodeSession, record: RunRecord, grace: float = 10.0) -> RunRecord:
    status = session.call("job_stop", {"job": record.job_id, "grace": grace}, timeout=grace + 15)
    record.update_from_node(status)
    save_run(record)
    return record


# --------------------------------------------------------------------------------------
# Through Slurm: a step in a running job (`srun --overlap`) or a new `sbatch` job
