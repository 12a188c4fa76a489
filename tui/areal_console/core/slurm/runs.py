"""Replay runs launched through Slurm: into a running Slurm job's allocation (an overlap
step) or as a new batch job; waiting for them and reading Slurm's view of their state.

Their records are the console's run records (`jobs.RunRecord`), kept beside those of runs
launched through a node's agent.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from areal_console.core.common import locations, private_files
from areal_console.core.common.errors import UserError
from areal_console.core.common.identity import login_user
from areal_console.core.replay.plan import ReplayPlan, resolve
from areal_console.core.replay.runs import RunRecord, new_run_id, save_run
from areal_console.core.slurm.client import (
    CommandRunner,
    LocalRunner,
    SlurmClient,
    SshLoginRunner,
    make_runner,
)
from areal_console.core.slurm.launch import BatchRequest, job_state, overlap_step_argv, submit_batch

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # one path component, as the agent's
SLURM_ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


@dataclass
class SlurmLaunch:
    """A replay started through Slurm; `process` holds an overlap step (None for sbatch)."""

    record: RunRecord
    runner: CommandRunner
    process: subprocess.Popen[bytes] | None = None


def slurm_command(plan: ReplayPlan, job_dir: str) -> list[str]:
    """The plan's argv with `{job_dir}` resolved; CPU runs hide every GPU from it."""
    argv = [resolve(a, job_dir) for a in plan.argv]
    if not plan.gpus:
        argv = ["env", "CUDA_VISIBLE_DEVICES=", *argv]
    return argv


# Makes the run's folder on a login host, as the user there: the data dir's `runs` folder
# (0700, ours, no link) and in it a new folder named by $1 (`mkdir` fails on anything
# already there); prints its physical path.
REMOTE_RUN_FOLDER = """set -e
umask 077
base="${XDG_DATA_HOME:-$HOME/.local/share}/areal-console"
ours() {
  if [ -L "$1" ] || [ ! -d "$1" ] || [ ! -O "$1" ]; then echo "$1 is not a folder of ours" >&2; exit 1; fi
  chmod 700 -- "$1"
}
mkdir -p -- "$base"
ours "$base"
mkdir -- "$base/runs" 2>/dev/null || :
ours "$base/runs"
mkdir -m 700 -- "$base/runs/$1"
cd -P -- "$base/runs/$1"
pwd
"""


def run_folder(runner: CommandRunner, job_id: str) -> str:
    """A new folder of ours for one run, where `runner` runs Slurm's commands: this
    machine's data dir (`runs/<id>`), or the same folder under the login host's data dir."""
    if not RUN_ID.fullmatch(job_id):
        raise UserError(f"bad run id {job_id!r}")
    if isinstance(runner, LocalRunner):
        return str(private_files.new_dir(locations.runs_dir() / job_id))
    made = runner.run(["sh", "-c", REMOTE_RUN_FOLDER, "sh", job_id], timeout=30)
    lines = made.stdout.strip().splitlines()
    if made.returncode != 0 or not lines or not lines[-1].startswith("/"):
        raise UserError(f"cannot create the run's folder on {runner.where}: {made.error_line}")
    return lines[-1]


def launch_slurm(
    runner: CommandRunner,
    plan: ReplayPlan,
    *,
    host_job: str | None,
    sbatch: bool,
    job_id: str | None = None,
    login: str | None = None,
    overrides: list[str] | None = None,
) -> SlurmLaunch:
    """Start the plan in `host_job`'s allocation on the plan's node, or as a new batch job.

    The run's folder is a fresh one of ours in the data dir where Slurm's commands run
    (`run_folder`), never in the dump (whose owner could swap what we make there); it is
    the step's working directory, and the trainer's log is `train.log` there. The record
    keeps the dump's path (`extra["dump"]`) for the Runs screen and the verification.
    """
    job_id = job_id or new_run_id()
    job_dir = run_folder(runner, job_id)
    log = f"{job_dir}/train.log"
    command = slurm_command(plan, job_dir)
    record = RunRecord(
        job_id=job_id,
        node=plan.node,
        plan=plan.to_json(),
        launched_at=time.time(),
        log=log,
        job_dir=job_dir,
        extra={"argv": command, "slurm_login": login, "dump": plan.dump_dir}
        | ({"overrides": list(overrides)} if overrides else {}),
        user=login_user(),
    )
    process = None
    if sbatch:
        request = BatchRequest(
            command=command,
            name=job_id,
            gpus_per_node=len(plan.gpus),
            chdir=job_dir,
            output=log,
        )
        record.slurm_job = submit_batch(runner, request)
        record.extra["slurm_state"] = "PENDING"
    else:
        if not host_job:
            raise UserError("a replay into a running job's allocation needs --slurm-job")
        argv = overlap_step_argv(
            host_job, plan.node, command, gpus=len(plan.gpus), name=job_id, chdir=job_dir
        )
        argv[-len(command) - 1 : -len(command) - 1] = [f"--output={log}", "--input=none"]
        local = runner.process_argv(argv) if isinstance(runner, SshLoginRunner) else argv
        env = runner.env if isinstance(runner, LocalRunner) else None
        srun_log = locations.jobs_dir() / f"{job_id}.srun.log"  # srun's own messages
        record.extra["srun_log"] = str(srun_log)
        with private_files.create(srun_log) as errors:
            process = subprocess.Popen(
                local,
                stdin=subprocess.DEVNULL,
                stdout=errors,
                stderr=errors,
                env=env,
                start_new_session=True,  # the step outlives the console unless it waits
            )
        record.slurm_job = host_job
        record.slurm_step = _find_step(runner, host_job, job_id, process)
        record.extra["slurm_state"] = "RUNNING"
    save_run(record)
    return SlurmLaunch(record, runner, process)


def _find_step(
    runner: CommandRunner, host_job: str, name: str, process: subprocess.Popen[bytes]
) -> str | None:
    """The id ("JOB.STEP") of the step named `name`, while it runs (None if it ended first)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        out = runner.run(["squeue", "-h", "-s", "-j", host_job, "-o", "%i %j"], timeout=15)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == name:
                return parts[0]
        if process.poll() is not None:
            return None
        time.sleep(0.2)
    return None


def wait_slurm(launch: SlurmLaunch, timeout: float, poll: float = 0.5) -> RunRecord:
    """Wait for the step (its srun) or the batch job (`job_state`) to end, and record it."""
    record = launch.record
    deadline = time.monotonic() + timeout
    if launch.process is not None:
        try:
            code = launch.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return record
        try:
            stderr = Path(record.extra["srun_log"]).read_text(errors="replace")
        except OSError:
            stderr = ""
        record.exit_code = code
        record.state = "finished" if code == 0 else "failed"
        record.extra["slurm_state"] = "COMPLETED" if code == 0 else "FAILED"
        if code != 0 and stderr.strip():
            record.error = stderr.strip().splitlines()[-1]
        save_run(record)
        return record
    while True:
        refresh_slurm(record, launch.runner)
        if record.state != "running" or time.monotonic() >= deadline:
            return record
        time.sleep(poll)


def refresh_slurm(record: RunRecord, runner: CommandRunner | None = None) -> RunRecord:
    """Slurm's view of a job launched through it: the batch job's state, or whether the
    step still runs (a step that ended is "unknown" here: its exit code was srun's)."""
    runner = runner or make_runner(record.extra.get("slurm_login"))
    assert record.slurm_job is not None
    if record.slurm_step:
        out = runner.run(["squeue", "-h", "-s", "-j", record.slurm_job, "-o", "%i"], timeout=15)
        if out.returncode == 0 and record.slurm_step not in out.stdout.split():
            record.extra["slurm_state"] = "ENDED"
            record.state = "unknown"
            record.error = (
                f"step {record.slurm_step} ended; its exit code went to srun (see the log)"
            )
        save_run(record)
        return record
    state, exit_code = job_state(SlurmClient(runner), record.slurm_job)
    record.extra["slurm_state"] = state
    if state not in SLURM_ACTIVE:
        first = exit_code.split(":")[0] if exit_code else ""
        record.exit_code = int(first) if first.isdigit() else None
        if state == "COMPLETED":
            record.state = "finished"
        elif state == "CANCELLED":
            record.state = "stopped"
        else:
            record.state, record.error = "failed", f"Slurm job {record.slurm_job}: {state}"
    save_run(record)
    return record
