"""`--areal EXPERIMENT/TRIAL`: an AReaL job's nodes, found from its name-resolve records.

The records (core/targets/name_resolve.py) say where each worker listens. Each address is probed
once, all at once, with one bound on the whole probe: an entry whose address refuses or
does not answer is `stale` (a worker gone, or a node that no longer answers), reported,
never waited on. The nodes are reached:

- through Slurm when AReaL's Slurm scheduler runs the job: its per-role jobs
  `{experiment}_{trial}:{role}` (areal/infra/scheduler/slurm.py:165-166, :848-851) are
  found with `squeue --name` and their nodes reached through `srun --overlap`;
- otherwise over SSH to each address (the user's ssh_config applies), or as this machine
  when the address is one of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any

from areal_node.tcp_probe import PROBE_TIMEOUT, probe_addresses

from areal_console.core.common.errors import UserError
from areal_console.core.targets.name_resolve import (
    DEFAULT_NFS_ROOT,
    JobName,
    JobRecords,
    NameEntry,
    NodeNfsRegistry,
    Registry,
    find_job,
    open_registry,
    parse_job_name,
)
from areal_console.core.targets.specs import NodeSpec, local_node

# AReaL's worker roles (DESIGN: actor, ref, critic, teacher, rollout, eval-rollout, data,
# proxy-rollout): asked of Slurm by name besides the roles the records name.
AREAL_ROLES = (
    "actor",
    "ref",
    "critic",
    "teacher",
    "rollout",
    "eval-rollout",
    "data",
    "proxy-rollout",
)


@dataclass(frozen=True)
class EntryState:
    """One record and what the probe found: "ok", or "stale" with why."""

    entry: NameEntry
    state: str
    reason: str | None = None
    node: str | None = None

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {
            "key": e.key,
            "kind": e.kind,
            "role": e.role,
            "index": e.index,
            "address": e.value,
            "node": self.node,
            "state": self.state,
            "reason": self.reason,
        }


@dataclass
class ArealPlan:
    """What `--areal` resolved to: the job, its nodes, its records' states."""

    name: JobName
    source: str
    specs: list[NodeSpec]
    entries: list[EntryState]
    refused: list[str] = field(default_factory=list)
    slurm_jobs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fileroot: str | None = None
    ended_roles: list[EndedRole] = field(default_factory=list)

    @property
    def job_key(self) -> str:
        """The job as the agent names it on processes (`job` = "E/T")."""
        return self.name.short

    @property
    def stale(self) -> list[EntryState]:
        return [e for e in self.entries if e.state == "stale"]

    def warnings(self) -> list[str]:
        """One line per stale record (the `warning:` lines), then the refused ones."""
        lines = [f"{e.entry.label} at {e.entry.value}: stale ({e.reason})" for e in self.stale]
        lines += [f"entry refused: {r}" for r in self.refused]
        lines += [e.describe() for e in self.ended_roles]
        return lines

    def log_dir(self) -> str | None:
        """<fileroot>/logs/<user>/<experiment>/<trial> when the fileroot is known."""
        if not self.fileroot:
            return None
        n = self.name
        return os.path.join(self.fileroot, "logs", n.user, n.experiment, n.trial)

    @property
    def command_match(self) -> str:
        """A regex for the job's worker command lines (`--experiment-name E ... --trial-name
        T`, areal/infra/rpc/guard/app.py:518-519), to find its log directory from them."""
        e, t = re.escape(self.name.experiment), re.escape(self.name.trial)
        return rf"--experiment-name[= ]{e}(\s.*)?\s--trial-name[= ]{t}(\s|$)"

    def log_target(self) -> tuple[str | None, str | None, str | None]:
        """(path, node, match) for the Health view and `metrics`: the log directory from
        `--fileroot` on the job's first node, else the workers' command lines decide."""
        path = self.log_dir()
        if path is not None:
            first = self.specs[0] if self.specs else None
            node = first.name if first is not None and first.transport != "local" else None
            return path, node, None
        return None, None, self.command_match

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.name.key,
            "source": self.source,
            "slurm_jobs": list(self.slurm_jobs),
            "log_dir": self.log_dir(),
            "entries": [e.to_json() for e in self.entries],
            "refused": list(self.refused),
            "ended_roles": [e.to_json() for e in self.ended_roles],
        }


def own_addresses() -> set[str]:
    """Addresses that mean this machine: loopback's first, and the host name's."""
    found = {"127.0.0.1", "::1", "localhost"}
    try:
        name = socket.gethostname()
        found.add(name)
        for info in socket.getaddrinfo(name, None):
            found.add(str(info[4][0]))
    except OSError:
        pass
    return found


def specs_for_hosts(hosts: list[str], mine: set[str]) -> list[NodeSpec]:
    """One node per host, in order: this machine as itself, the others over SSH."""
    specs: list[NodeSpec] = []
    for host in dict.fromkeys(hosts):
        if host in mine:
            if not any(s.transport == "local" for s in specs):
                specs.append(local_node())
            continue
        specs.append(NodeSpec(name=host, transport="ssh", host=host))
    return specs


def with_states(
    records: JobRecords, probe_timeout: float = PROBE_TIMEOUT, via: Any = None
) -> list[EntryState]:
    """Each record with the probe's verdict: from here, and for the addresses this
    machine cannot reach, from the `via` node too (its agent's `tcp_probe`)."""
    addresses = [(e.host, e.port) for e in records.entries if e.host is not None and e.port]
    verdicts = probe_addresses(addresses, probe_timeout)
    if via is not None:
        verdicts.update(probe_via(via, verdicts, probe_timeout))
    states = []
    for e in records.entries:
        if e.host is None or e.port is None:
            states.append(EntryState(e, "stale", f"not a host:port address: {e.value!r}"))
            continue
        why = verdicts.get((e.host, e.port))
        states.append(EntryState(e, "stale" if why else "ok", why, e.host))
    return states


def probe_via(
    via: Any, verdicts: dict[tuple[str, int], str | None], timeout: float
) -> dict[tuple[str, int], str | None]:
    """The addresses that failed from here, probed by the node `via` (a `NodeSession`):
    reachable there is live; unreachable from both keeps both reasons."""
    failed = [addr for addr, why in verdicts.items() if why is not None]
    if not failed:
        return {}
    answer = _ask(via, "tcp_probe", {"addresses": [list(a) for a in failed], "timeout": timeout})
    out: dict[tuple[str, int], str | None] = {}
    for item in answer.get("verdicts", []) if isinstance(answer, dict) else []:
        if not (isinstance(item, list) and len(item) == 3):
            continue
        addr = (str(item[0]), item[1])
        if addr not in verdicts:
            continue
        theirs = item[2]
        mine = verdicts[addr]
        out[addr] = (
            None
            if theirs is None
            else (mine if theirs == mine else f"{mine}; from {via.name}: {theirs}")
        )
    return out


def _ask(via: Any, op: str, args: dict[str, Any]) -> Any:
    """One request to the `--name-resolve-via` node; its failure is one line."""
    from areal_console.core.connection.client import AgentDisconnected, AgentError

    try:
        return via.call(op, args, timeout=30.0)
    except AgentDisconnected as exc:
        raise UserError(f"--name-resolve-via {via.name}: cannot reach it ({exc})") from None
    except AgentError as exc:
        raise UserError(f"--name-resolve-via {via.name}: {exc}") from None


def via_registry(via: Any, root: str | None) -> Registry:
    """The nfs records under `root` as the node `via` sees them."""
    return NodeNfsRegistry(via.name, root or DEFAULT_NFS_ROOT, lambda op, a: _ask(via, op, a))


# A role's Slurm job that ended in one of these while another role's still runs is a dead
# role: the others wait for it (AReaL issue 1583).
ENDED_STATES = ("COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED")


@dataclass(frozen=True)
class EndedRole:
    role: str
    job_id: str
    name: str
    state: str
    exit_code: str | None  # "status:signal"
    source: str  # "squeue" or "sacct"

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "job_id": self.job_id, "name": self.name,
                "state": self.state, "exit_code": self.exit_code, "source": self.source}  # fmt: skip

    def describe(self) -> str:
        code = f", exit code {self.exit_code}" if self.exit_code else ""
        return (f"role {self.role}: its Slurm job {self.job_id} ({self.name}) is {self.state}"
                f"{code} while the job's other roles still run")  # fmt: skip


def slurm_role_jobs(
    name: JobName, roles: list[str], login: str | None, timeout: float
) -> tuple[list[Any], list[EndedRole]]:
    """The job's per-role Slurm jobs that run now, and the roles whose job ended (state and
    exit code from squeue, else sacct) while another role's runs; empty where Slurm is not
    here."""
    from areal_console.core.slurm.client import SlurmClient, make_runner

    if not login and shutil.which("squeue") is None:
        return [], []
    client = SlurmClient(make_runner(login), timeout)
    by_role = {name.slurm_prefix + r: r for r in dict.fromkeys([*roles, *AREAL_ROLES])}
    try:
        jobs = client.named(by_role, user=name.user, all_states=True)
    except UserError:
        return [], []
    active = [j for j in jobs if j.active]
    if not active:
        return [], []
    running = {j.name for j in jobs if j.active or j.state == "PENDING"}
    ended: dict[str, EndedRole] = {}
    for j in sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0):
        state = j.state.split()[0] if j.state else ""
        if state in ENDED_STATES and j.name not in running:
            code = client.exit_code(j.job_id)
            ended[j.name] = EndedRole(by_role[j.name], j.job_id, j.name, state, code, "squeue")
    # A role the records name that squeue no longer lists (Slurm forgets an ended job
    # after MinJobAge): accounting may still know how it ended.
    forgotten = [
        n for n, r in by_role.items() if r in roles and n not in running and n not in ended
    ]
    for j in client.accounted(forgotten, user=name.user):
        state = j.state
        if state in ENDED_STATES and j.name not in running:
            ended[j.name] = EndedRole(
                by_role[j.name], j.job_id, j.name, state, j.exit_code, "sacct"
            )
    return active, sorted(ended.values(), key=lambda e: e.role)


def ended_roles_now(plan: ArealPlan, login: str | None, timeout: float) -> list[EndedRole]:
    """The plan's job's roles whose Slurm job has ended by now (asked of Slurm again: a
    console open for hours sees a role end after it started)."""
    roles = sorted({e.entry.role for e in plan.entries if e.entry.role})
    return slurm_role_jobs(plan.name, roles, login, timeout)[1]


def resolve_areal_targets(
    text: str,
    nfs_root: str | None = None,
    etcd3: str | None = None,
    login: str | None = None,
    mode: str = "step",
    slurm_timeout: float = 30.0,
    probe_timeout: float = PROBE_TIMEOUT,
    fileroot: str | None = None,
    via: Any = None,
    registry: Registry | None = None,
) -> ArealPlan:
    """`--areal [USER/]EXPERIMENT/TRIAL` -> the job's nodes and its records' states;
    `via` (a `NodeSession`): read the nfs records through that node's agent; `registry`:
    a backend already open (AReaL's Ray KV actor with `--ray`)."""
    name = parse_job_name(text)
    if registry is None:
        registry = open_registry(nfs_root, etcd3) if via is None else via_registry(via, nfs_root)
    records = find_job(registry, name)
    states = with_states(records, probe_timeout, via)
    plan = ArealPlan(name, registry.source, [], states, list(records.refused), fileroot=fileroot)
    roles = sorted({e.role for e in records.entries if e.role})
    jobs, ended = slurm_role_jobs(name, roles, login, slurm_timeout)
    plan.ended_roles = ended
    if jobs:
        _reach_through_slurm(plan, jobs, login, mode, slurm_timeout)
    else:
        hosts = [s.entry.host for s in states if s.entry.host]
        plan.specs = specs_for_hosts([h for h in hosts if h], own_addresses())
    return plan


def _reach_through_slurm(
    plan: ArealPlan, jobs: list[Any], login: str | None, mode: str, timeout: float
) -> None:
    from areal_console.core.slurm.client import SlurmClient, make_runner, running_job
    from areal_console.core.slurm.targets import plan_for_job

    runner = make_runner(login)
    client = SlurmClient(runner, timeout)
    seen: set[str] = set()
    for queued in sorted(jobs, key=lambda j: j.name):
        job = running_job(client, queued.job_id)
        plan.slurm_jobs.append(f"{job.job_id} ({job.name})")
        sub = plan_for_job(runner, job, login, mode, True, timeout)
        plan.notes += sub.notes
        for spec in sub.specs:
            if spec.name not in seen:
                seen.add(spec.name)
                plan.specs.append(spec)
    plan.notes.append(
        f"AReaL job {plan.name.short} runs as Slurm jobs {', '.join(plan.slurm_jobs)}"
    )
