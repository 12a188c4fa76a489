"""`--slurm-job JOBID`: the job's nodes as node specs, reached through srun or SSH.

Slurm is asked once for the job; nodes Slurm already knows are down are kept (shown down,
with Slurm's reason) but not contacted. One cheap probe step (`srun --overlap ... true`)
tells whether srun can join the job at all; if not (no srun, a job of another user, a
site that forbids overlapping steps) the nodes are reached over SSH, and a note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.common.textfmt import clip_repr
from areal_console.core.slurm.client import (
    SLURM_COMMAND_TIMEOUT,
    CommandRunner,
    SlurmClient,
    SlurmJob,
    make_runner,
    running_job,
)
from areal_console.core.targets.specs import NodeSpec, SlurmTarget

SLURM_MODES = ("step", "node", "ssh")
JOB_ID = re.compile(r"\d+(_\d+)?(\+\d+)?")


@dataclass
class SlurmPlan:
    """What `--slurm-job` resolved to."""

    job: SlurmJob
    specs: list[NodeSpec]
    transport: str  # "slurm" or "ssh"
    notes: list[str] = field(default_factory=list)


def probe_srun(
    runner: CommandRunner, job: SlurmJob, node: str, timeout: float = SLURM_COMMAND_TIMEOUT
) -> str | None:
    """None when srun can start a step in the job on `node`; otherwise why not."""
    argv = [
        "srun",
        "--overlap",
        f"--jobid={job.job_id}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
        "/bin/sh",  # by its path: under --export=NONE the step has no PATH
        "-c",
        "exit 0",
    ]
    result = runner.run(argv, timeout)
    if result.returncode == 0:
        return None
    if result.returncode == 127:
        return f"srun is not available on {runner.where}"
    return f"srun can't join job {job.job_id}: {result.error_line}"


def ssh_specs(job: SlurmJob, login: str | None) -> list[NodeSpec]:
    # Compute nodes are usually reachable only from inside the cluster: jump via the login host.
    return [NodeSpec(name=node, transport="ssh", host=node, proxy_jump=login) for node in job.nodes]


def slurm_specs(job: SlurmJob, login: str | None, mode: str) -> list[NodeSpec]:
    unreachable = job.unreachable_nodes()
    reachable = tuple(n for n in job.nodes if n not in unreachable)
    # One shared step asks every node for the same GPUs: the fewest any node holds.
    gpus = min((len(job.gpus.get(n, [])) for n in reachable), default=0)
    target = SlurmTarget(job_id=job.job_id, login=login, nodes=reachable, mode=mode, gpus=gpus)
    specs = []
    for node in job.nodes:
        node_target = target
        if node in unreachable:
            node_target = SlurmTarget(
                job_id=job.job_id,
                login=login,
                nodes=(node,),
                mode="node",
                unreachable=unreachable[node],
            )
        specs.append(NodeSpec(name=node, transport="slurm", host=node, slurm=node_target))
    return specs


def resolve_slurm_targets(
    job_id: str,
    login: str | None = None,
    mode: str = "step",
    runner: CommandRunner | None = None,
    probe: bool = True,
    timeout: float = SLURM_COMMAND_TIMEOUT,
) -> SlurmPlan:
    """The running job's nodes as specs; `UserError` when the job can't be inspected.
    `timeout` bounds each of Slurm's commands (scontrol, squeue, the srun probe)."""
    if mode not in SLURM_MODES:
        raise UserError(f"--slurm-mode must be one of {', '.join(SLURM_MODES)}, not {mode!r}")
    runner = runner or make_runner(login)
    client = SlurmClient(runner, timeout)
    notes: list[str] = []
    if not JOB_ID.fullmatch(job_id):
        name, job_id = job_id, job_id_by_name(client, job_id)
        notes.append(f"Slurm job {job_id} is the one named {clip_repr(name)}")
    job = running_job(client, job_id)
    return plan_for_job(runner, job, login, mode, probe, timeout, notes)


def plan_for_job(
    runner: CommandRunner,
    job: SlurmJob,
    login: str | None,
    mode: str,
    probe: bool,
    timeout: float,
    notes: list[str] | None = None,
) -> SlurmPlan:
    """How to reach a running job's nodes: srun steps, or SSH when srun can't join."""
    notes = list(notes or [])
    down = job.unreachable_nodes()
    for reason in down.values():
        notes.append(f"{reason}: not contacting it")
    if mode == "ssh":
        return SlurmPlan(job, ssh_specs(job, login), "ssh", notes)
    reachable = [n for n in job.nodes if n not in down]
    if probe and reachable:
        why_not = probe_srun(runner, job, reachable[0], timeout)
        if why_not is not None:
            notes.append(f"{why_not}; reaching the job's {len(job.nodes)} nodes over SSH instead")
            return SlurmPlan(job, ssh_specs(job, login), "ssh", notes)
    return SlurmPlan(job, slurm_specs(job, login, mode), "slurm", notes)


def job_id_by_name(client: SlurmClient, name: str) -> str:
    """The one running (else queued) job named `name`, as `squeue --name` finds it; AReaL's
    Slurm scheduler names each role's job `{experiment}_{trial}:{role}`."""
    if not name.strip() or "," in name or any(ord(c) < 32 for c in name):
        # squeue --name takes a comma-separated list: a comma can't be part of one name
        raise UsageError(f"{clip_repr(name)} is not a Slurm job id or name")
    jobs = client.named([name])
    if not jobs:
        raise UserError(
            f"no Slurm job named {clip_repr(name)} in the queue on {client.runner.where}"
        )
    running = [j for j in jobs if j.active] or jobs
    if len(running) > 1:
        ids = ", ".join(j.job_id for j in running)
        raise UserError(
            f"{len(running)} Slurm jobs are named {clip_repr(name)} ({ids}): give an id"
        )
    return running[0].job_id
