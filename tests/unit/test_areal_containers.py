"""AReaL workers inside a container, as AReaL's Slurm scheduler starts them: `srun ...
singularity exec --no-home --writable-tmpfs --nv [--env K=V ...] IMAGE bash -c "...
python -m areal.infra.rpc.rpc_server ..."` (its default `container_type="apptainer"`;
areal/infra/scheduler/slurm.py:81, :922-936, :953-955 at AReaL cbff54d6), the index from
SLURM_PROCID (areal/infra/rpc/guard/app.py:565-568).

Debian has no apptainer/singularity and no image registry is reachable here, so the
container is what such a runtime makes of a worker: its own mount and PID namespaces
(`unshare --pid --mount --fork --mount-proc`), under a parent process named
`singularity` that stays in the host's namespaces (util-linux's `unshare` under that
name: it forks the container's first process and waits for it, as the runtime's parent
does). The agent runs in the host's namespaces and must list the workers by their host
PIDs, with role and index, call the runtime a wrapper, and py-spy them there.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import JOBS, run_cli, wait_for

STUB = JOBS / "areal_stub"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="new mount and PID namespaces need root"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is missing"),
    pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is missing"),
]


@dataclass
class ContainerJob:
    experiment: str
    trial: str
    runtimes: list[subprocess.Popen[bytes]]

    @property
    def job(self) -> str:
        return f"{self.experiment}/{self.trial}"


def pids_in_namespace(runtime: int) -> set[int]:
    """Host PIDs of the processes under the runtime's child (the container's init)."""
    out: set[int] = set()
    stack = [runtime]
    while stack:
        pid = stack.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        out.update(map(int, children))
        stack += map(int, children)
    return out


@pytest.fixture(scope="module")
def container_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerJob]:
    base = tmp_path_factory.mktemp("containers")
    runtime = base / "bin" / "singularity"
    runtime.parent.mkdir()
    shutil.copy(shutil.which("unshare") or "unshare", runtime)
    job = ContainerJob("exp", f"ctr-{secrets.token_hex(3)}", [])
    for procid in (0, 1):
        worker = (
            f"stdbuf -oL python3 -m areal.infra.rpc.rpc_server --host 127.0.0.1 --port 0 "
            f"--experiment-name {job.experiment} --trial-name {job.trial} --role actor "
            f"--name-resolve-type nfs --nfs-record-root {base}/name_resolve "
            f"--fileroot {base} 2>&1 | tee -a {base}/actor-{procid}.log"
        )
        env = {**os.environ, "PYTHONPATH": str(STUB), "OMP_NUM_THREADS": "1",
               "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid), "SLURM_NTASKS": "2"}  # fmt: skip
        job.runtimes.append(
            subprocess.Popen(
                [
                    str(runtime),
                    "--pid",
                    "--mount",
                    "--fork",
                    "--mount-proc",
                    "--kill-child",
                    "bash",
                    "-c",
                    worker,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    try:
        logs = [base / f"actor-{i}.log" for i in (0, 1)]
        wait_for(lambda: all(p.exists() and "serving" in p.read_text() for p in logs), 60,
                 "both containerised workers serving")  # fmt: skip
        yield job
    finally:
        for proc in job.runtimes:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def job_processes(job: ContainerJob) -> list[dict[str, Any]]:
    out = run_cli("nodes", "--local", "--json")
    assert out.returncode == 0, out.stderr
    procs = json.loads(out.stdout)["nodes"][0]["processes"]
    return [p for p in procs if p.get("job") == job.job]


def test_workers_in_their_own_namespaces_are_listed_by_host_pid(
    container_job: ContainerJob,
) -> None:
    procs = job_processes(container_job)
    workers = sorted((p for p in procs if p["role"] == "actor"), key=lambda p: p["rank"])
    assert [(p["worker_index"], p["rank"], p["world_size"]) for p in workers] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    for runtime, worker in zip(container_job.runtimes, workers, strict=True):
        # The host PID (inside, the worker is a low PID of its own namespace).
        assert worker["pid"] in pids_in_namespace(runtime.pid)
        ns = Path(f"/proc/{worker['pid']}/ns/pid").readlink()
        assert ns != Path("/proc/self/ns/pid").readlink()
    runtimes = [p for p in procs if p["cmdline"].split()[0].endswith("/singularity")]
    assert sorted(p["pid"] for p in runtimes) == sorted(r.pid for r in container_job.runtimes)
    assert all(p["role"] == "wrapper" and p["rank"] is None for p in runtimes)
    # Nothing but the workers claims a rank: not the runtime, its shell or tee (all of
    # which carry SLURM_PROCID as well).
    ranked = [(p["pid"], p["ppid"], p["rank"], p["role"], p["cmdline"][:80]) for p in procs
              if p["rank"] is not None]  # fmt: skip
    assert sorted(r[2] for r in ranked) == [0, 1], ranked


def test_stacks_dumps_the_containerised_workers_by_host_pid(
    container_job: ContainerJob,
) -> None:
    out = run_cli("stacks", "--local", "--json", "--match", container_job.trial)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ranks = {r["rank"]: r for r in doc["ranks"] if r["rank"] is not None}
    assert sorted(ranks) == [0, 1]
    for r in ranks.values():
        assert r["state"] == "ok", r
        names = {t["name"] for t in r["threads"]}
        assert {"MainThread", "EngineWorker"} <= names
        assert r["role"] == "actor"
