"""An AReaL job run by AReaL's Slurm scheduler, on the real local Slurm cluster: one sbatch
job per role named `{experiment}_{trial}:{role}` (areal/infra/scheduler/slurm.py:165-166),
workers indexed by SLURM_PROCID that register in nfs name-resolve themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import JOBS, ROOT, wait_for

from tests.support.report_checks import (
    Planted,
    areal_checkout,
    assert_no_secret,
    assert_template,
    bundle_files,
    section,
)
from tests.support.slurm_cluster import SlurmCluster

pytest_plugins = ["conftest_slurm"]

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

USER = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
EXPERIMENT, TRIAL = "exp", "slurm1"


@dataclass
class ArealSlurmJob:
    job_id: str
    root: Path
    name: str
    fileroot: Path
    commit: str
    """AReaL's commit: the workers run it from a source checkout."""
    planted: Planted
    """Secrets in the workers' argv and environment, config.yaml and the role log."""

    @property
    def log_dir(self) -> Path:
        return self.fileroot / "logs" / USER / EXPERIMENT / TRIAL


@pytest.fixture(scope="module")
def areal_slurm_job(slurm_cluster: SlurmCluster) -> Iterator[ArealSlurmJob]:
    """The actor role: 2 nodes x 1 task, submitted as AReaL's scheduler names it, AReaL
    from a source checkout; secrets planted in the workers' argv and environment, in the
    run's config.yaml and in the role log (for `report`)."""
    base = Path(tempfile.mkdtemp(prefix="areal-", dir=slurm_cluster.base))
    root, fileroot = base / "name_resolve", base / "fileroot"
    commit = areal_checkout(JOBS / "areal_stub", base / "checkout")
    planted = Planted()
    log_dir = fileroot / "logs" / USER / EXPERIMENT / TRIAL
    log_dir.mkdir(parents=True)
    # config.yaml as AReaL's save_config leaves it in the log directory.
    (log_dir / "config.yaml").write_text(
        f"experiment_name: {EXPERIMENT}\ntrial_name: {TRIAL}\ncluster:\n  fileroot: {fileroot}\n"
        f"stats_logger:\n  wandb:\n    wandb_api_key: '{planted.wandb}'\n"
        f"    wandb_base_url: 'https://bob:{planted.url_password}@wandb.example.com'\n"
    )
    name = f"{EXPERIMENT}_{TRIAL}:actor"
    env = ",".join(f"{k}={v}" for k, v in {**planted.env(), "NCCL_DEBUG": "INFO"}.items())
    job_id = slurm_cluster.sbatch(
        (JOBS / "areal_slurm_role.sh").read_text(),
        "--nodes=2",
        "--ntasks-per-node=1",
        f"--job-name={name}",
        "--output=/dev/null",
        f"--export=ALL,{env}",
        args=(sys.executable, str(base / "checkout"), str(root), str(fileroot),
              EXPERIMENT, TRIAL, "actor", f"--hf-token={planted.hf}",
              f"RAY_AUTH_TOKEN={planted.ray}"),
    )  # fmt: skip
    workers = root / USER / EXPERIMENT / TRIAL / "workers" / "actor"
    try:
        wait_for(lambda: len(list(workers.glob("*/ENTRY"))) == 2, 120, "both workers' records")
        with open(log_dir / "actor.log", "a") as fh:
            fh.write(planted.wandb_login_line())
        yield ArealSlurmJob(str(job_id), root, name, fileroot, commit, planted)
    finally:
        slurm_cluster.run(["scancel", str(job_id)], check=False)


def console(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    return subprocess.run(
        [sys.executable, "-m", "areal_console", *args],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def test_areal_finds_the_roles_slurm_job_by_name(
    slurm_cluster: SlurmCluster, areal_slurm_job: ArealSlurmJob
) -> None:
    result = console(slurm_cluster, "nodes", "--areal", f"{EXPERIMENT}/{TRIAL}",
                     "--name-resolve-root", str(areal_slurm_job.root), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["areal"]["slurm_jobs"] == [f"{areal_slurm_job.job_id} ({areal_slurm_job.name})"]
    assert [n["state"] for n in doc["nodes"]] == ["up", "up"]
    assert {n["name"] for n in doc["nodes"]} == {"node1", "node2"}
    workers = [p for n in doc["nodes"] for p in n["processes"] if p["role"] == "actor"]
    # No --worker-index on the command line: index and rank come from SLURM_PROCID.
    assert sorted((p["worker_index"], p["rank"]) for p in workers) == [(0, 0), (1, 1)]
    assert all("--worker-index" not in p["cmdline"] for p in workers)
    assert {e["state"] for e in doc["areal"]["entries"]} == {"ok"}


def test_slurm_job_accepts_the_roles_job_name(
    slurm_cluster: SlurmCluster, areal_slurm_job: ArealSlurmJob
) -> None:
    result = console(slurm_cluster, "nodes", "--slurm-job", areal_slurm_job.name, "--json")
    assert result.returncode == 0, result.stderr
    assert (
        f"note: Slurm job {areal_slurm_job.job_id} is the one named '{areal_slurm_job.name}'"
        in result.stderr
    )
    assert len(json.loads(result.stdout)["nodes"]) == 2
    unknown = console(slurm_cluster, "nodes", "--slurm-job", "exp_nope:actor")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: no Slurm job named 'exp_nope:actor' in the queue")


def test_report_on_the_slurm_job_then_once_it_is_gone(
    slurm_cluster: SlurmCluster, areal_slurm_job: ArealSlurmJob, tmp_path: Path
) -> None:
    """Last in this module: it cancels the job. `report --areal E/T` reaches the role's
    Slurm job; once it is gone, the same command reports from the capture it saved and the
    log directory, and names what it could not collect."""
    import platform

    import torch

    job, planted = areal_slurm_job, areal_slurm_job.planted.values
    result = console(slurm_cluster, "report", "--areal", f"{EXPERIMENT}/{TRIAL}",
                     "--name-resolve-root", str(job.root), "-o", str(tmp_path / "bug.md"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    md, files = (tmp_path / "bug.md").read_text(), bundle_files(tmp_path / "bug.tar.gz")
    assert_template(md)
    assert_no_secret(planted, md, files)
    stacks = json.loads(files["stacks.json"])
    assert stacks["job"] == f"areal:{EXPERIMENT}/{TRIAL}"
    assert sorted((r["rank"], r["node"]) for r in stacks["ranks"]) == [(0, "node1"), (1, "node2")]
    assert stacks["diagnosis"]["title"] in section(md, "### Describe the bug")
    # Full logs: the tee on the batch host writes one directory that both nodes see.
    logs = section(md, "### Full logs")
    assert f"Log directory: `{job.log_dir}` on 2 nodes (node1, node2);" in logs
    assert "**Nodes node1, node2 (one shared directory)**:" in logs
    assert f"actor: {job.log_dir}/actor.log (last" in logs
    assert f"every role: {job.log_dir}/merged.log (last" in logs
    assert "[actor]   worker actor/-1 serving on 127.0.0.1:0" in logs
    assert "***(wandb_api_key)" in logs  # the key wandb echoed, masked with its name
    assert {"logs/node1+node2/actor.log", "logs/node1+node2/merged.log"} <= set(files)
    # Commit ID and Environment, read on each node from the workers' interpreter.
    assert f"AReaL 2.0.0, git commit `{job.commit}` on branch `main`" in md
    env = section(md, "### Environment")
    assert "All 2 nodes (node1, node2) agree:" in env
    assert (
        f"- Python {platform.python_version()} ({sys.executable}): torch {torch.__version__}" in env
    )
    assert "NCCL_DEBUG=INFO" in env and "WANDB_API_KEY=***" in env and "HF_TOKEN=***" in env
    versions = {v["node"]: v for v in json.loads(files["versions.json"])}
    assert sorted(versions) == ["node1", "node2"]
    pids = {r["node"]: r["pid"] for r in stacks["ranks"]}
    for node, v in versions.items():
        assert [i["pid"] for i in v["interpreters"]] == [pids[node]]
    # Script: the worker's command line, its secrets masked; config.yaml from the log dir.
    script = section(md, "### Script")
    assert "-m areal.infra.rpc.rpc_server --experiment-name exp --trial-name slurm1" in script
    assert "--hf-token=***" in script and "RAY_AUTH_TOKEN=***" in script
    assert "wandb_api_key: '***'" in script and "https://bob:***@wandb.example.com" in script

    # Gone: the Slurm job ends; its name-resolve records stay behind.
    slurm_cluster.run(["scancel", job.job_id], check=False)
    wait_for(lambda: slurm_cluster.job_state(job.job_id) in ("GONE", "CANCELLED", "COMPLETED"),
             60, "the job to end")  # fmt: skip
    gone = console(slurm_cluster, "report", "--areal", f"{EXPERIMENT}/{TRIAL}",
                   "--name-resolve-root", str(job.root), "-o", str(tmp_path / "gone.md"))  # fmt: skip
    # Partial (3), as every command on a job with stale records: the warnings say why.
    assert gone.returncode == 3, gone.stderr
    assert f"wrote {tmp_path / 'gone.md'} and " in gone.stdout
    assert "warning: actor/0 at 127.0.0.1:" in gone.stderr and ": stale (" in gone.stderr
    assert "warning: not collected" not in gone.stderr
    md = (tmp_path / "gone.md").read_text()
    assert f"stacks from the saved capture {stacks['id']} taken at" in md
    assert "(no rank of the job runs on the targets now)" in md
    assert f"actor: {job.log_dir}/actor.log (last" in md
    # Versions: the interpreter the saved command line names (the ranks' PYTHONPATH is gone).
    assert "any more: read there is the interpreter its command line names" in md
    assert_no_secret(planted, md, bundle_files(tmp_path / "gone.tar.gz"))
    # Its records cleaned up too: the saved capture and --fileroot's log directory.
    empty = tmp_path / "no-records"
    empty.mkdir()
    gone = console(slurm_cluster, "report", "--areal", f"{EXPERIMENT}/{TRIAL}",
                   "--name-resolve-root", str(empty), "--fileroot", str(job.fileroot),
                   "-o", str(tmp_path / "gone2.md"))  # fmt: skip
    assert gone.returncode == 3, gone.stderr
    assert (
        "warning: not collected: targets: the job's nodes: no AReaL job exp/slurm1" in gone.stderr
    )
    md = (tmp_path / "gone2.md").read_text()
    assert f"stacks from the saved capture {stacks['id']} taken at" in md
    assert "(the job is gone)" in md and f"every role: {job.log_dir}/merged.log" in md
    assert "- targets: the job's nodes: no AReaL job exp/slurm1" in md
    assert "No process of the job runs on this machine any more" in md
    assert "Not known: AReaL was not found in the interpreter the job's command line names" in md
    assert_no_secret(planted, md, bundle_files(tmp_path / "gone2.tar.gz"))
