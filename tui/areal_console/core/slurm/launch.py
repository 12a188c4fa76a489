"""Launching a run (e.g. a replay) on a Slurm cluster.

Two ways, both argv lists end to end (no word of a path or a UI field is re-split):

- `batch_script` + `submit_batch`: a new `sbatch` job; it survives the console (and a
  dropped login connection), and its id and state are what the Runs view shows;
- `overlap_step_argv`: a step inside a running job's allocation on a chosen node
  (`srun --overlap`), for runs that must share the job's nodes; the step lives as long as
  the srun process that holds it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from areal_console.core.common.errors import UserError
from areal_console.core.slurm.client import CommandRunner, SlurmClient


@dataclass(frozen=True)
class BatchRequest:
    """What to run as a new job, and where."""

    command: list[str]
    name: str = "areal-replay"
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    chdir: str | None = None
    output: str | None = None  # sbatch's output pattern (default: slurm-%j.out in chdir)
    partition: str | None = None
    time_limit: str | None = None  # e.g. "01:00:00"
    env: tuple[tuple[str, str], ...] = ()


def batch_script(request: BatchRequest) -> str:
    """The batch script: options as `#SBATCH` lines, the command quoted word by word."""
    if not request.command:
        raise UserError("nothing to run: the command is empty")
    lines = ["#!/bin/sh", f"#SBATCH --job-name={request.name}", f"#SBATCH --nodes={request.nodes}"]
    lines.append(f"#SBATCH --cpus-per-task={request.cpus_per_task}")
    if request.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{request.gpus_per_node}")
    for flag, value in _path_options(request):
        if "\n" in value:
            raise UserError(f"--{flag} can't contain a line break")
        if not re.search(r"\s", value):  # else on sbatch's command line (`argv_options`)
            lines.append(f"#SBATCH --{flag}={value}")
    for key, value in request.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"not an environment variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append("exec " + shlex.join(request.command))
    return "\n".join(lines) + "\n"


def _path_options(request: BatchRequest) -> list[tuple[str, str]]:
    options = (
        ("chdir", request.chdir),
        ("output", request.output),
        ("partition", request.partition),
        ("time", request.time_limit),
    )
    return [(flag, value) for flag, value in options if value]


def argv_options(request: BatchRequest) -> list[str]:
    """Options whose values hold blanks: `#SBATCH` lines would split them, argv words don't."""
    return [f"--{f}={v}" for f, v in _path_options(request) if re.search(r"\s", v)]


def submit_batch(runner: CommandRunner, request: BatchRequest, timeout: float = 60.0) -> str:
    """Submit with `sbatch --parsable` (script on stdin); the new job's id."""
    script = batch_script(request)
    result = runner.run(["sbatch", "--parsable", *argv_options(request)], timeout, stdin=script)
    if result.returncode != 0:
        raise UserError(f"sbatch refused the run on {runner.where}: {result.error_line}")
    job_id = result.stdout.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise UserError(f"sbatch answered something unexpected: {result.stdout.strip()[:200]}")
    return job_id


def overlap_step_argv(
    job_id: str,
    node: str,
    command: list[str],
    gpus: int = 0,
    name: str = "areal-replay",
    chdir: str | None = None,
) -> list[str]:
    """`srun --overlap` into a running job on one node (argv for a `CommandRunner`)."""
    if not command:
        raise UserError("nothing to run: the command is empty")
    argv = [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={name}",
        "--kill-on-bad-exit=1",
    ]
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    if chdir:
        argv.append(f"--chdir={chdir}")
    return [*argv, "--", *command]


def job_state(client: SlurmClient, job_id: str) -> tuple[str, str | None]:
    """(state, exit code "N:S" or None) of a job, for a Runs view that polls."""
    job = client.job(job_id, with_steps=False, with_nodes=False)
    return job.state, job.exit_code
