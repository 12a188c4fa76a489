"""Launchers are not ranks, on the real Slurm cluster: two torchrun launchers started by
srun (SLURM_PROCID 0 and 1) run one 5-rank job; `nodes --slurm-job` lists ranks 0-4 once
each and neither launcher as a rank (before: 0,0,1,1,2,3,4)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.cluster.test_slurm import console
from tests.support.slurm_cluster import SlurmCluster, free_port

pytest_plugins = ["conftest_slurm"]

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def test_torchrun_under_srun_lists_each_rank_once_and_no_launcher_rank(
    slurm_cluster: SlurmCluster,
) -> None:
    ready = Path(tempfile.mkdtemp(prefix="ready-", dir=slurm_cluster.base))
    job_id = slurm_cluster.sbatch(
        (JOBS / "slurm_torchrun.sh").read_text(),
        "--nodes=1",
        "--ntasks=2",
        "--job-name=torchrun-launchers",
        f"--chdir={ready}",
        f"--output={ready}/job.log",
        args=(sys.executable, str(JOBS / "gloo_ranks.py"), str(ready), str(free_port())),
    )
    try:
        deadline = time.monotonic() + 180
        while len(list(ready.glob("rank*.ready"))) < 5:
            state = slurm_cluster.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "CONFIGURING"):
                log = (ready / "job.log").read_text() if (ready / "job.log").exists() else ""
                raise RuntimeError(f"job {job_id} ended early ({state}): {log[-2000:]}")
            assert time.monotonic() < deadline, "the 5 ranks did not start"
            time.sleep(0.5)
        result = console(slurm_cluster, "nodes", "--slurm-job", str(job_id), "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        processes = [p for n in report["nodes"] for p in n["processes"]]
        ranks = sorted(p["rank"] for p in processes if p["rank"] is not None)
        assert ranks == [0, 1, 2, 3, 4], ranks
        launchers = [p for p in processes if "torch.distributed.run" in p["cmdline"]
                     and "gloo_ranks.py" in p["cmdline"] and p["role"] == "launcher"]  # fmt: skip
        assert len(launchers) == 2, [p["cmdline"][:80] for p in processes]
        assert all(p["rank"] is None for p in launchers)
        workers = [p for p in processes if p["rank"] is not None]
        assert all(p["world_size"] == 5 for p in workers)
        assert sorted(p["local_rank"] for p in workers) == [0, 0, 1, 1, 2]
    finally:
        slurm_cluster.run(["scancel", str(job_id)], check=False)
