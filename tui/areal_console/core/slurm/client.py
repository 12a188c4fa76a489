"""Slurm: what a job is (nodes, GPUs, steps, state, user) and how to reach its nodes.

The console asks Slurm's own commands (`scontrol show job -d -o`, `scontrol show step -o`,
`scontrol show node -o`, `scontrol show hostnames`, `squeue`) through a `CommandRunner`:
locally when it runs on a login node, or through one connection to a login host. Parsing is
pure functions over the commands' text, unit-tested on output recorded from a real Slurm.

Agents reach the job's nodes with `srun --overlap --jobid JOB`, which joins the running
allocation without taking resources from it (see `slurm_channel.py`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from areal_console.core.common import locations, private_files
from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.common.textfmt import clip_repr
from areal_console.core.targets.hostlist import expand_hostlist

# Job states with processes to inspect; everything else is waiting or over.
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING"})
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "REQUEUE_HOLD"})
# Node state words that mean slurmd can't start anything there now.
UNREACHABLE_NODE_FLAGS = ("DOWN", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "FAIL")


# --------------------------------------------------------------------------------------
# Running Slurm's commands


@dataclass
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_line(self) -> str:
        """The most telling line of stderr (Slurm puts the reason last)."""
        lines = [ln.strip() for ln in self.stderr.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else f"{self.argv[0]} exited with status {self.returncode}"


class StepProcess(Protocol):
    """A long-lived command (an srun step) as a line channel, with its stderr at hand."""

    def send(self, data: bytes) -> None: ...

    def recv_line(self) -> bytes: ...

    def close(self) -> None: ...

    def exit_reason(self) -> str: ...

    def stderr_lines(self) -> list[str]: ...

    def wait_stderr(self, timeout: float = 5.0) -> None: ...


class CommandRunner(Protocol):
    """Runs argv lists where Slurm's client commands are: here, or on a login host.

    Another transport (e.g. a paramiko session to the login host) plugs in by providing
    `run` (a command to completion) and `start` (a long-lived command as a `StepProcess`).
    """

    where: str  # for messages: "this machine" or "login host HOST"

    def run(
        self, argv: list[str], timeout: float = 30.0, stdin: str | None = None
    ) -> CommandResult: ...

    def start(
        self, argv: list[str], what: str, on_stderr: Callable[[str], None] | None = None
    ) -> StepProcess: ...


# Variables an enclosing job or step sets for its own srun/sbatch/squeue (`srun`'s "input
# environment variables": SLURM_NNODES, SLURM_NTASKS, SLURM_MEM_PER_NODE, ...). A console
# started inside a job (the watch as a small Slurm job beside the training job) must not
# hand them to its `srun --jobid OTHER`: they would shape that step after its own job
# ("Only allocated 1 nodes asked for 3"). Where Slurm is configured stays.
_JOB_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
_KEPT_SLURM_ENV = frozenset({"SLURM_CONF", "SLURM_CLUSTERS"})


def outside_job_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str] | None:
    """`environ` without what an enclosing Slurm job or step set (None: not inside one,
    the environment is passed on as it is)."""
    if "SLURM_JOB_ID" not in environ and "SLURM_JOBID" not in environ:
        return None
    return {k: v for k, v in environ.items()
            if k in _KEPT_SLURM_ENV or not k.startswith(_JOB_ENV_PREFIXES)}  # fmt: skip


class LocalRunner:
    """Slurm's commands on this machine (the console runs on a login node, or inside a
    job of its own: that job's variables are left out, see `outside_job_env`)."""

    where = "this machine"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env if env is not None else outside_job_env(os.environ)

    def run(
        self, argv: list[str], timeout: float = 30.0, stdin: str | None = None
    ) -> CommandResult:
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env,
                check=False,
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(argv, 124, "", f"{argv[0]}: no answer within {timeout:g}s")
        return CommandResult(argv, done.returncode, done.stdout, done.stderr)

    def start(
        self, argv: list[str], what: str, on_stderr: Callable[[str], None] | None = None
    ) -> StepProcess:
        from areal_console.core.connection.transport import ProcessChannel

        return ProcessChannel(argv, what, env=self.env, on_stderr=on_stderr)


class SshLoginRunner:
    """Slurm's commands on a login host, through the OpenSSH client (`~/.ssh/config` applies).

    Each argv is quoted for the remote shell with `shlex.join`, so no word of it is ever
    re-split or expanded there.
    """

    def __init__(
        self,
        login: str,
        ssh: str = "ssh",
        options: list[str] | None = None,
        multiplex: bool = True,
    ) -> None:
        self.login = login
        self.where = f"login host {login}"
        self.ssh = ssh
        self.options = list(options or [])  # extra ssh options (as ~/.ssh/config would give)
        self.multiplex = multiplex

    def _ssh_argv(self) -> list[str]:
        host, port = self.login, None
        if re.fullmatch(r".+:\d+", self.login) and "]" not in self.login:
            host, _, p = self.login.rpartition(":")
            port = p
        argv = [self.ssh, "-T", "-o", "BatchMode=yes", *self.options]
        if self.multiplex:
            argv += self._multiplex_options()
        if port:
            argv += ["-p", port]
        return [*argv, host, "--"]

    @staticmethod
    def _multiplex_options() -> list[str]:
        """Share one SSH connection between all commands (queries, steps) for a while."""
        directory = locations.cache_dir() / "ssh"
        # A unix socket path has ~107 bytes: ssh adds "/" + 40 (%C) + 17 (a temporary suffix).
        if len(str(directory)) > 45:
            directory = Path(tempfile.gettempdir()) / f"areal-console-ssh-{os.getuid()}"
        try:
            private_files.private_dir(directory)
        except (OSError, UserError):
            return []  # not a folder of ours (e.g. planted in /tmp): no shared connection
        return [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={directory}/%C",
            "-o",
            "ControlPersist=120",
        ]

    def process_argv(self, argv: list[str]) -> list[str]:
        """The local ssh command line that runs `argv` on the login host."""
        return [*self._ssh_argv(), shlex.join(argv)]

    def start(
        self, argv: list[str], what: str, on_stderr: Callable[[str], None] | None = None
    ) -> StepProcess:
        from areal_console.core.connection.transport import ProcessChannel

        return ProcessChannel(self.process_argv(argv), what, on_stderr=on_stderr)

    def close(self) -> None:
        """End the shared connection now rather than after ControlPersist."""
        if not self.multiplex:
            return
        argv = self._ssh_argv()
        argv[argv.index("--") : argv.index("--") + 1] = []
        argv.insert(1, "-O")
        argv.insert(2, "exit")
        LocalRunner().run(argv, timeout=10)

    def run(
        self, argv: list[str], timeout: float = 30.0, stdin: str | None = None
    ) -> CommandResult:
        result = LocalRunner().run(self.process_argv(argv), timeout, stdin)
        result.argv = argv
        if result.returncode == 255:  # ssh's own failure, not the remote command's
            result.stderr = f"cannot reach {self.where}: {result.error_line}"
        return result


def make_runner(login: str | None) -> CommandRunner:
    return SshLoginRunner(login) if login else LocalRunner()


# --------------------------------------------------------------------------------------
# What Slurm says about a job


@dataclass
class SlurmStep:
    step_id: str  # "123.0", "123.batch"
    name: str
    state: str
    nodes: list[str]
    tasks: int | None


@dataclass
class SlurmJob:
    job_id: str
    name: str
    user: str
    state: str
    reason: str
    nodelist: str
    nodes: list[str]
    num_tasks: int | None
    partition: str
    batch_host: str | None
    tres_per_node: str | None
    # node -> GPU indices the job holds there (from `scontrol show job -d`: GRES=gpu:2(IDX:0-1))
    gpus: dict[str, list[int]] = field(default_factory=dict)
    steps: list[SlurmStep] = field(default_factory=list)
    # node -> Slurm's state for it ("MIXED", "MIXED+NOT_RESPONDING", "DOWN+DRAIN"...)
    node_states: dict[str, str] = field(default_factory=dict)
    node_reasons: dict[str, str] = field(default_factory=dict)
    exit_code: str | None = None  # "0:0" (status:signal) once known

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def unreachable_nodes(self) -> dict[str, str]:
        """Nodes Slurm already knows it can't start a step on: node -> why."""
        out: dict[str, str] = {}
        for node in self.nodes:
            state = self.node_states.get(node, "")
            words = state.split("+")
            if any(w in UNREACHABLE_NODE_FLAGS for w in words):
                reason = self.node_reasons.get(node)
                out[node] = f"Slurm reports node {node} {state}" + (
                    f" ({reason})" if reason else ""
                )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "state": self.state,
            "reason": self.reason,
            "nodelist": self.nodelist,
            "nodes": self.nodes,
            "num_tasks": self.num_tasks,
            "partition": self.partition,
            "batch_host": self.batch_host,
            "tres_per_node": self.tres_per_node,
            "gpus": self.gpus,
            "steps": [s.__dict__ for s in self.steps],
            "node_states": self.node_states,
        }


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/.()]*?)=")


def parse_scontrol_record(line: str) -> list[tuple[str, str]]:
    """`Key=Value Key2=Value two ...` (one `-o` line) as ordered pairs.

    Values may hold spaces (a job name, a comment); a value runs until the next ` Key=`.
    Keys repeat in `-d` output (one `Nodes=... GRES=...` group per node set), hence a list.
    """
    matches = list(_KEY.finditer(line))
    pairs: list[tuple[str, str]] = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        pairs.append((m.group(1), line[m.end() : end].strip()))
    return pairs


def parse_hostnames(text: str) -> list[str]:
    """`scontrol show hostnames` output: one node name a line."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _none_if_null(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A") else value


def parse_index_list(text: str) -> list[int]:
    """`0-1,3` -> [0, 1, 3] (GPU indices in `IDX:`)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


# One entry of a GRES list starts `gpu` at the list's start or after a separator: from
# every `gpu` of `gpu:gpu:gpu:...` (a job's comment can hold ` GRES=...`), the scan ran to
# the end of the list again.
_GPU_IDX = re.compile(r"(?<![^,\s=])gpu(?::[\w.-]+)*?:\d+\(IDX:([\d,\-]+)\)")


def parse_gres_gpus(gres: str) -> list[int]:
    """`gpu:2(IDX:0-1)` or `gpu:a100:1(IDX:3),nic:1` -> GPU indices."""
    out: list[int] = []
    for m in _GPU_IDX.finditer(gres):
        out.extend(parse_index_list(m.group(1)))
    return out


def parse_job_record(line: str, expand: Any = expand_hostlist) -> SlurmJob:
    """One `scontrol show job -d -o` line -> `SlurmJob` (steps and node states empty)."""
    pairs = parse_scontrol_record(line)
    first: dict[str, str] = {}
    gpus: dict[str, list[int]] = {}
    group_nodes: list[str] = []
    for key, value in pairs:
        first.setdefault(key, value)
        if key == "Nodes":  # a `-d` detail group starts
            group_nodes = expand(value)
        elif key == "GRES" and group_nodes:
            indices = parse_gres_gpus(value)
            if indices:
                for node in group_nodes:
                    gpus[node] = indices
    user = first.get("UserId", "")
    nodelist = _none_if_null(first.get("NodeList")) or ""
    state = first.get("JobState", "UNKNOWN")
    return SlurmJob(
        job_id=first.get("JobId", ""),
        name=first.get("JobName", ""),
        user=user.split("(", 1)[0],
        state=state,
        reason=first.get("Reason", "None"),
        nodelist=nodelist,
        nodes=expand(nodelist) if nodelist else [],
        num_tasks=_int_or_none(first.get("NumTasks")),
        partition=first.get("Partition", ""),
        batch_host=_none_if_null(first.get("BatchHost")),
        tres_per_node=_none_if_null(first.get("TresPerNode")),
        gpus=gpus,
        exit_code=_none_if_null(first.get("ExitCode")),
    )


def parse_step_records(text: str, expand: Any = expand_hostlist) -> list[SlurmStep]:
    """`scontrol show step -o JOB` output -> steps (batch/extern included)."""
    steps: list[SlurmStep] = []
    for line in text.splitlines():
        if not line.startswith("StepId="):
            continue
        rec = dict(parse_scontrol_record(line))
        nodelist = _none_if_null(rec.get("NodeList")) or ""
        steps.append(
            SlurmStep(
                step_id=rec.get("StepId", ""),
                name=rec.get("Name", ""),
                state=rec.get("State", ""),
                nodes=expand(nodelist) if nodelist else [],
                tasks=_int_or_none(rec.get("Tasks")),
            )
        )
    return steps


def parse_node_records(text: str) -> dict[str, tuple[str, str | None]]:
    """`scontrol show node -o` output -> node -> (State, Reason)."""
    out: dict[str, tuple[str, str | None]] = {}
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        rec = dict(parse_scontrol_record(line))
        out[rec["NodeName"]] = (rec.get("State", "UNKNOWN"), _none_if_null(rec.get("Reason")))
    return out


SQUEUE_FORMAT = "%i|%j|%u|%T|%r|%D|%N|%b"


def parse_squeue_lines(text: str, expand: Any = expand_hostlist) -> list[SlurmJob]:
    """`squeue -h -o SQUEUE_FORMAT` -> jobs (the user's job list; no GPUs or steps)."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 8:
            continue
        job_id, name, user, state, reason, _count, nodelist, gres = fields
        nodes_known = nodelist and not nodelist.startswith("(")
        jobs.append(
            SlurmJob(
                job_id=job_id,
                name=name,
                user=user,
                state=state,
                reason=reason,
                nodelist=nodelist if nodes_known else "",
                nodes=expand(nodelist) if nodes_known else [],
                num_tasks=None,
                partition="",
                batch_host=None,
                tres_per_node=_none_if_null(gres),
            )
        )
    return jobs


def parse_sacct_lines(text: str) -> list[SlurmJob]:
    """`sacct -n -P -X -o JobID,JobName,User,State,ExitCode` -> jobs (state and exit code).
    sacct writes `CANCELLED by 0`: the first word is the state."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        job_id, name, user, state, exit_code = fields
        jobs.append(SlurmJob(job_id=job_id, name=name, user=user,
                             state=(state.split() or [""])[0], reason="", nodelist="",
                             nodes=[], num_tasks=None, partition="", batch_host=None,
                             tres_per_node=None, exit_code=exit_code or None))  # fmt: skip
    return jobs


def parse_squeue_json(text: str, expand: Any = expand_hostlist) -> list[SlurmJob]:
    """`squeue --json` (OpenAPI v0.0.3x) -> jobs. Older Slurm ignores `-j` here: filter after."""
    data = json.loads(text)
    jobs: list[SlurmJob] = []
    for j in data.get("jobs", []):
        nodelist = j.get("nodes") or ""
        state = j.get("job_state")
        if isinstance(state, list):  # newer OpenAPI versions: a list of flags
            state = state[0] if state else "UNKNOWN"
        jobs.append(
            SlurmJob(
                job_id=str(j.get("job_id", "")),
                name=str(j.get("name", "")),
                user=str(j.get("user_name", "")),
                state=str(state or "UNKNOWN"),
                reason=str(j.get("state_reason", "None")),
                nodelist=nodelist,
                nodes=expand(nodelist) if nodelist else [],
                num_tasks=_int_or_none(str(j["tasks"]))
                if isinstance(j.get("tasks"), int)
                else None,
                partition=str(j.get("partition", "")),
                batch_host=j.get("batch_host") or None,
                tres_per_node=j.get("tres_per_node") or None,
            )
        )
    return jobs


# --------------------------------------------------------------------------------------
# Asking Slurm


SLURM_COMMAND_TIMEOUT = 30.0
"""Default bound on one of Slurm's commands (`--slurm-timeout` sets it)."""


class SlurmClient:
    """Slurm's view of jobs, through one `CommandRunner`."""

    def __init__(
        self, runner: CommandRunner | None = None, timeout: float = SLURM_COMMAND_TIMEOUT
    ) -> None:
        self.runner = runner or LocalRunner()
        self.timeout = timeout

    def _run(self, argv: list[str]) -> CommandResult:
        result = self.runner.run(argv, self.timeout)
        if result.returncode == 127:
            raise UserError(
                f"Slurm's `{argv[0]}` is not available on {self.runner.where}"
                " (run the console on a login node, or pass --login HOST)"
            )
        return result

    def hostnames(self, nodelist: str) -> list[str]:
        if not nodelist:
            return []
        result = self._run(["scontrol", "show", "hostnames", nodelist])
        if result.returncode != 0:
            return expand_hostlist(nodelist)
        return parse_hostnames(result.stdout)

    def job(self, job_id: str, with_steps: bool = True, with_nodes: bool = True) -> SlurmJob:
        """The job as Slurm sees it now; a clear `UserError` if it doesn't exist."""
        if not re.fullmatch(r"\d+(_\d+)?(\+\d+)?", job_id):
            raise UsageError(  # a bad value: exit 2
                f"{clip_repr(job_id)} is not a Slurm job id (expected a number such as 12345)"
            )
        result = self._run(["scontrol", "show", "job", "-d", "-o", job_id])
        if result.returncode != 0 or not result.stdout.strip():
            why = result.error_line
            if "Invalid job id" in why:
                raise UserError(
                    f"Slurm job {job_id} not found on {self.runner.where}"
                    " (it may have ended long ago: Slurm forgets jobs after MinJobAge)"
                )
            raise UserError(f"cannot query Slurm job {job_id}: {why}")
        line = result.stdout.strip().splitlines()[0]
        job = parse_job_record(line, expand=lambda expr: self.hostnames(expr))
        if with_steps and job.active:
            steps = self._run(["scontrol", "show", "step", "-o", job.job_id])
            if steps.returncode == 0:
                job.steps = parse_step_records(steps.stdout, expand=lambda e: self.hostnames(e))
        if with_nodes and job.nodes:
            nodes = self._run(["scontrol", "show", "node", "-o", ",".join(job.nodes)])
            if nodes.returncode == 0:
                for name, (state, reason) in parse_node_records(nodes.stdout).items():
                    job.node_states[name] = state
                    if reason:
                        job.node_reasons[name] = reason
        return job

    def jobs(self, user: str | None = None) -> list[SlurmJob]:
        """Jobs in the queue (one user's, when given), for a job picker."""
        argv = ["squeue", "-h", "-o", SQUEUE_FORMAT]
        if user:
            argv += ["-u", user]
        result = self._run(argv)
        if result.returncode != 0:
            raise UserError(f"squeue failed on {self.runner.where}: {result.error_line}")
        return parse_squeue_lines(result.stdout)

    def named(
        self, names: Iterable[str], user: str | None = None, all_states: bool = False
    ) -> list[SlurmJob]:
        """Queued or running jobs with one of these names (`squeue --name`); with
        `all_states`, also those that ended and Slurm still holds (MinJobAge)."""
        wanted = sorted(set(names))
        if not wanted:
            return []
        argv = ["squeue", "-h", f"--name={','.join(wanted)}", "-o", SQUEUE_FORMAT]
        if all_states:
            argv += ["-t", "all"]
        if user:
            argv += ["-u", user]
        result = self._run(argv)
        if result.returncode != 0:
            raise UserError(f"squeue failed on {self.runner.where}: {result.error_line}")
        return [j for j in parse_squeue_lines(result.stdout) if j.name in wanted]

    def exit_code(self, job_id: str) -> str | None:
        """An ended job's `ExitCode` ("status:signal") from `scontrol show job` (None: gone)."""
        result = self._run(["scontrol", "show", "job", "-o", job_id])
        if result.returncode != 0 or not result.stdout.strip():
            return None
        return _none_if_null(
            dict(parse_scontrol_record(result.stdout.splitlines()[0])).get("ExitCode")
        )

    def accounted(self, names: Iterable[str], user: str | None = None) -> list[SlurmJob]:
        """Jobs with these names from Slurm's accounting (`sacct`), for those the queue
        forgot: state and exit code only. Empty where accounting is off."""
        wanted = sorted(set(names))
        if not wanted:
            return []
        argv = ["sacct", "-n", "-P", "-X", f"--name={','.join(wanted)}",
                "-o", "JobID,JobName,User,State,ExitCode"]  # fmt: skip
        argv += ["-u", user] if user else ["-a"]
        result = self._run(argv)
        if result.returncode != 0:
            return []
        return [j for j in parse_sacct_lines(result.stdout) if j.name in wanted]

    def current_user(self) -> str:
        result = self._run(["id", "-un"])
        return result.stdout.strip() or "?"


def job_lister(runner: CommandRunner | None = None) -> Callable[[bool], list[SlurmJob]]:
    """`list_jobs(all_users)` for the Slurm view: your jobs, or everyone's."""
    client = SlurmClient(runner)
    me: list[str] = []

    def list_jobs(all_users: bool) -> list[SlurmJob]:
        if all_users:
            return client.jobs(None)
        if not me:
            me.append(client.current_user())
        return client.jobs(me[0])

    return list_jobs


def running_job(client: SlurmClient, job_id: str) -> SlurmJob:
    """The job, if it has processes to look at; otherwise a `UserError` saying why not."""
    job = client.job(job_id)
    if job.active and job.nodes:
        return job
    if job.state in WAITING_STATES:
        raise UserError(
            f"Slurm job {job_id} is {job.state} ({job.reason}): it has no nodes to inspect yet"
        )
    raise UserError(
        f"Slurm job {job_id} is {job.state}: it has ended, so there are no processes to inspect"
        " (its dumps and logs are still on disk)"
    )


def format_nodes(nodes: Iterable[str]) -> str:
    return ",".join(nodes)


def job_matches(job: SlurmJob, text: str) -> bool:
    """Does `text` (case-insensitive) occur in the job's id, name, user, state or nodes?"""
    if not text:
        return True
    needle = text.lower()
    fields = (job.job_id, job.name, job.user, job.state, job.nodelist, *job.nodes)
    return any(needle in f.lower() for f in fields)


def job_row(job: SlurmJob) -> tuple[str, str, str, str, str, str]:
    """A job as the Slurm view shows it: id, name, user, state, nodes (or why none), GRES."""
    nodes = job.nodelist or f"({job.reason})"
    gres = (job.tres_per_node or "-").removeprefix("gres:")
    return (job.job_id, job.name, job.user, job.state, nodes, gres)
