"""A dead role on the real local Slurm cluster: an AReaL job run by AReaL's Slurm
scheduler (one sbatch job per role, `{experiment}_{trial}:{role}`), one role's job
cancelled while the other's runs (AReaL issue 1583: the others wait for it)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
from areal_console.core.targets.areal import ArealPlan, EntryState, ended_roles_now
from areal_console.core.targets.name_resolve import find_job, open_registry, parse_job_name
from conftest import JOBS, wait_for

from tests.cluster.test_areal_slurm import USER, console
from tests.support.slurm_cluster import SlurmCluster

pytest_plugins = ["conftest_slurm"]

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

EXPERIMENT, TRIAL = "exp", "dead1"


def _submit(cluster: SlurmCluster, base: Path, role: str) -> str:
    root, fileroot = base / "name_resolve", base / "fileroot"
    job = cluster.sbatch(
        (JOBS / "areal_slurm_role.sh").read_text(),
        "--nodes=1",
        "--ntasks-per-node=1",
        f"--job-name={EXPERIMENT}_{TRIAL}:{role}",
        "--output=/dev/null",
        args=(sys.executable, str(JOBS / "areal_stub"), str(root), str(fileroot),
              EXPERIMENT, TRIAL, role),
    )  # fmt: skip
    return str(job)


def test_a_role_whose_job_was_cancelled_while_another_runs_is_named(
    slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = Path(tempfile.mkdtemp(prefix="areal-dead-", dir=slurm_cluster.base))
    workers = base / "name_resolve" / USER / EXPERIMENT / TRIAL / "workers"
    actor = _submit(slurm_cluster, base, "actor")
    rollout = _submit(slurm_cluster, base, "rollout")
    try:
        wait_for(lambda: len(list(workers.glob("*/*/ENTRY"))) == 2, 120, "both roles' records")
        areal = [
            "--areal",
            f"{EXPERIMENT}/{TRIAL}",
            "--name-resolve-root",
            str(base / "name_resolve"),
        ]
        alive = console(slurm_cluster, "nodes", *areal, "--json")
        assert alive.returncode == 0, alive.stderr
        assert json.loads(alive.stdout)["areal"]["ended_roles"] == []
        # The job as a console started now holds it (its records, both roles running).
        monkeypatch.setenv("SLURM_CONF", slurm_cluster.env()["SLURM_CONF"])
        name = parse_job_name(f"{EXPERIMENT}/{TRIAL}")
        records = find_job(open_registry(str(base / "name_resolve"), None), name)
        plan = ArealPlan(name, "nfs", [], [EntryState(e, "ok") for e in records.entries])
        assert ended_roles_now(plan, None, 30.0) == []

        slurm_cluster.run(["scancel", rollout])

        def cancelled() -> bool:
            out = slurm_cluster.run(["squeue", "-h", "-t", "all", "-j", rollout, "-o", "%T"])
            return out.stdout.strip() == "CANCELLED"

        wait_for(cancelled, 60, "the rollout job cancelled")
        # The console asks Slurm again at each capture: the role that ended since it started.
        [now] = ended_roles_now(plan, None, 30.0)
        assert (now.role, now.job_id, now.state) == ("rollout", rollout, "CANCELLED")
        result = console(slurm_cluster, "nodes", *areal, "--json")
        assert result.returncode == 3, result.stderr  # partial: a role is gone
        [ended] = json.loads(result.stdout)["areal"]["ended_roles"]
        assert ended["role"] == "rollout" and ended["job_id"] == rollout
        assert ended["name"] == f"{EXPERIMENT}_{TRIAL}:rollout"
        assert ended["state"] == "CANCELLED" and ended["source"] == "squeue"
        assert ended["exit_code"] is not None and ":" in ended["exit_code"]
        line = (f"warning: role rollout: its Slurm job {rollout} ({EXPERIMENT}_{TRIAL}:rollout) "
                f"is CANCELLED, exit code {ended['exit_code']} while the job's other roles "
                "still run")  # fmt: skip
        assert line in result.stderr
        stacks = console(slurm_cluster, "stacks", *areal, "--json")
        assert line in stacks.stderr, stacks.stderr
        # The diagnosis names the ended role as the likely cause, where the actor waits.
        doc = json.loads(stacks.stdout)
        assert doc["ended_roles"] == [ended]
        diagnosis = doc["diagnosis"]
        cause = (f"role rollout's Slurm job {rollout} ended CANCELLED "
                 f"(exit {ended['exit_code']}) while the actor's ranks wait")  # fmt: skip
        assert diagnosis["pattern"] == "role_ended", diagnosis
        assert diagnosis["title"].startswith(f"Likely cause: {cause}"), diagnosis
        assert f"sacct -j {rollout}" in diagnosis["suggestions"][0]
        text = console(slurm_cluster, "stacks", *areal)
        assert f"DIAGNOSIS [role_ended] Likely cause: {cause}" in text.stdout, text.stdout
    finally:
        slurm_cluster.run(["scancel", actor, rollout], check=False)
