"""`--areal EXPERIMENT/TRIAL`: an AReaL job's nodes, found from its name-resolve records.

The records (core/name_resolve.py) say where each worker listens. Each address is probed
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

import errno
import os
import re
import selectors
import shutil
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.name_resolve import (
    JobName,
    JobRecords,
    NameEntry,
    find_job,
    open_registry,
    parse_job_name,
)
from areal_console.core.specs import NodeSpec, local_node

PROBE_TIMEOUT = 2.0
PROBE_BATCH = 256  # sockets open at once
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
        }


def probe_addresses(
    addresses: list[tuple[str, int]], timeout: float = PROBE_TIMEOUT
) -> dict[tuple[str, int], str | None]:
    """address -> None when something accepts a TCP connection there, else why not. All
    addresses are tried at once (non-blocking connects); the whole probe takes at most
    about `timeout` per `PROBE_BATCH` addresses."""
    out: dict[tuple[str, int], str | None] = {}
    unique = list(dict.fromkeys(addresses))
    for start in range(0, len(unique), PROBE_BATCH):
        out.update(_probe_batch(unique[start : start + PROBE_BATCH], timeout))
    return out


def _probe_batch(batch: list[tuple[str, int]], timeout: float) -> dict[tuple[str, int], str | None]:
    out: dict[tuple[str, int], str | None] = {}
    sel = selectors.DefaultSelector()
    try:
        for addr in batch:
            host, port = addr
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:  # no IPv6 here, out of descriptors
                out[addr] = f"{_show(addr)}: {exc.strerror or exc}"
                continue
            sock.setblocking(False)
            try:
                code = sock.connect_ex((host, port))
            except OSError as exc:  # a host name that does not resolve
                code, why = -1, f"{_show(addr)}: {exc.strerror or exc}"
            if code == -1:
                out[addr] = why
                sock.close()
            elif code in (0, errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, addr)
            else:
                out[addr] = _why(code, addr)
                sock.close()
        deadline = time.monotonic() + timeout
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                code = ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                out[key.data] = None if code == 0 else _why(code, key.data)
                sel.unregister(ready)
                ready.close()
        for key in list(sel.get_map().values()):
            out[key.data] = f"no answer from {_show(key.data)} in {timeout:g}s"
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
    finally:
        for key in list(sel.get_map().values()):  # left by an error: never leak a socket
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return out


def _show(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(code: int, addr: tuple[str, int]) -> str:
    if code == errno.ECONNREFUSED:
        return f"nothing listens on {_show(addr)}: the worker is gone"
    return f"{_show(addr)}: {os.strerror(code)}"


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


def with_states(records: JobRecords, probe_timeout: float = PROBE_TIMEOUT) -> list[EntryState]:
    """Each record with the probe's verdict."""
    addresses = [(e.host, e.port) for e in records.entries if e.host is not None and e.port]
    verdicts = probe_addresses(addresses, probe_timeout)
    states = []
    for e in records.entries:
        if e.host is None or e.port is None:
            states.append(EntryState(e, "stale", f"not a host:port address: {e.value!r}"))
            continue
        why = verdicts.get((e.host, e.port))
        states.append(EntryState(e, "stale" if why else "ok", why, e.host))
    return states


def slurm_role_jobs(
    name: JobName, roles: list[str], login: str | None, timeout: float
) -> list[Any]:
    """The job's per-role Slurm jobs that run now (empty where Slurm is not here)."""
    from areal_console.core.errors import UserError
    from areal_console.core.slurm import SlurmClient, make_runner

    if not login and shutil.which("squeue") is None:
        return []
    client = SlurmClient(make_runner(login), timeout)
    names = [name.slurm_prefix + r for r in dict.fromkeys([*roles, *AREAL_ROLES])]
    try:
        jobs = client.named(names, user=name.user)
    except UserError:
        return []
    return [j for j in jobs if j.active]


def resolve_areal_targets(
    text: str,
    nfs_root: str | None = None,
    etcd3: str | None = None,
    login: str | None = None,
    mode: str = "step",
    slurm_timeout: float = 30.0,
    probe_timeout: float = PROBE_TIMEOUT,
    fileroot: str | None = None,
) -> ArealPlan:
    """`--areal [USER/]EXPERIMENT/TRIAL` -> the job's nodes and its records' states."""
    name = parse_job_name(text)
    registry = open_registry(nfs_root, etcd3)
    records = find_job(registry, name)
    states = with_states(records, probe_timeout)
    plan = ArealPlan(name, registry.source, [], states, list(records.refused), fileroot=fileroot)
    roles = sorted({e.role for e in records.entries if e.role})
    jobs = slurm_role_jobs(name, roles, login, slurm_timeout)
    if jobs:
        _reach_through_slurm(plan, jobs, login, mode, slurm_timeout)
    else:
        hosts = [s.entry.host for s in states if s.entry.host]
        plan.specs = specs_for_hosts([h for h in hosts if h], own_addresses())
    return plan


def _reach_through_slurm(
    plan: ArealPlan, jobs: list[Any], login: str | None, mode: str, timeout: float
) -> None:
    from areal_console.core.slurm import SlurmClient, make_runner, running_job
    from areal_console.core.slurm_targets import plan_for_job

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
