"""`areal-console report --ray` on the shared Ray test cluster's gloo job (four ranks as
Ray actors, two per node, in a cleanup deadlock), with the run's log directory at one path
on both nodes but a separate file system on each, as AReaL's Ray scheduler leaves it on
nodes without a shared one: every worker's actor writes `<role>.log` and `merged.log` into
`<fileroot>/logs/<user>/<experiment>/<trial>` on its own node
(areal/infra/scheduler/ray.py:681-701, 1603-1606, 290-296 at cbff54d).

Needs only what `ray_gloo_job` guarantees: both nodes up and the four ranks hung. It
mounts its own file system on each node (inside that node's mount namespace) and
unmounts it after; nothing else of the shared cluster changes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ray_cluster import HEAD_IP, RayCluster
from tests.support.report_checks import (
    assert_no_secret,
    assert_template,
    bundle_files,
    section,
)

pytest_plugins = ["conftest_ray"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
NODE2 = "127.0.0.3"
ROLE_LOGS = {  # what each node's workers wrote there: ranks 0-1 on the head, 2-3 on NODE2
    HEAD_IP: {"actor": ["rank 0 step 2 all_reduce_grads", "rank 1 step 2 all_reduce_grads"],
              "rollout": ["rollout worker 0: 64 trajectories queued"]},
    NODE2: {"actor": ["rank 2 step 2 all_reduce_grads",
                      "rank 3 step 2 failed: RuntimeError: loss is nan; cleaning up"]},
}  # fmt: skip


def on_node(cluster: RayCluster, ip: str, *argv: str, stdin: str | None = None) -> None:
    """Run a command in the mount namespace of the Ray node at `ip`."""
    subprocess.run(["nsenter", f"--target={cluster.ns_init(ip)}", "--mount", "--", *argv],
                   input=stdin, text=True, check=True, timeout=30)  # fmt: skip


@pytest.fixture
def per_node_logs(ray_cluster: RayCluster, ray_gloo_job: Any) -> Iterator[tuple[Path, str]]:
    """The log directory on each node's own tmpfs: role logs, merged.log, and on the head
    (where the controller runs) config.yaml. A secret of the ranks' environment is echoed
    in a log, another written in the config."""
    down = [n.ip for n in ray_cluster.nodes if not n.running]
    assert not down, (
        f"the shared Ray cluster has lost {', '.join(down)}: this test needs both nodes and "
        "ray_gloo_job's four ranks (a test that takes a node away runs after it or restores it)"
    )
    planted = json.loads((ray_gloo_job.state_dir / "planted.json").read_text())
    log_dir = Path(tempfile.mkdtemp(prefix="report-logs-", dir=ray_cluster.base))
    mounted = []
    try:
        for ip, roles in ROLE_LOGS.items():
            on_node(ray_cluster, ip, "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(log_dir))
            mounted.append(ip)
            merged = []
            for role, lines in roles.items():
                if role == "actor" and ip == NODE2:
                    lines = [*lines, f"wandb: Appending key to your netrc file: "
                             f"{planted['WANDB_API_KEY']}"]  # fmt: skip
                on_node(ray_cluster, ip, "sh", "-c", f"cat > {log_dir}/{role}.log",
                        stdin="".join(f"{line}\n" for line in lines))  # fmt: skip
                merged += [f"{f'[{role}]':<10}{line}\n" for line in lines]
            on_node(ray_cluster, ip, "sh", "-c", f"cat > {log_dir}/merged.log",
                    stdin="".join(merged))  # fmt: skip
        on_node(ray_cluster, HEAD_IP, "sh", "-c", f"cat > {log_dir}/config.yaml",
                stdin=f"experiment_name: gloo\ntrial_name: ray\nstats_logger:\n  wandb:\n"
                f"    wandb_api_key: '{planted['WANDB_API_KEY']}'\n"
                f"hf_token: '{planted['HF_TOKEN']}'\n")  # fmt: skip
        assert not any(log_dir.iterdir())  # here, and so on a shared file system: nothing
        yield log_dir, planted
    finally:
        for ip in mounted:
            on_node(ray_cluster, ip, "umount", str(log_dir))


def test_report_on_ray_reads_each_nodes_logs_and_versions(
    ray_cluster: RayCluster, ray_gloo_job: Any, per_node_logs: tuple[Path, Any], tmp_path: Path
) -> None:
    import torch

    log_dir, planted = per_node_logs
    env = ray_cluster.env(PYTHONPATH=f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}")
    result = subprocess.run(
        [sys.executable, "-m", "areal_console", "report", "--ray", ray_cluster.address,
         "--logs", str(log_dir), "-o", str(tmp_path / "bug.md")],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    md, files = (tmp_path / "bug.md").read_text(), bundle_files(tmp_path / "bug.tar.gz")
    assert_template(md)
    assert_no_secret(tuple(planted.values()), md, files)
    # The ranks where Ray placed them, and the diagnosis the capture made.
    stacks = json.loads(files["stacks.json"])
    assert sorted((r["rank"], r["node"]) for r in stacks["ranks"]) == [
        (0, HEAD_IP), (1, HEAD_IP), (2, NODE2), (3, NODE2),
    ]  # fmt: skip
    assert stacks["diagnosis"]["pattern"] == "cleanup_deadlock"
    assert stacks["diagnosis"]["title"] in section(md, "### Describe the bug")
    checklist = section(md, "## Checklist")
    assert "Everyone waits on rank 3" in checklist and "ranks 0-2 only wait" in checklist
    # Full logs: each node's own files, grouped by node, each role named.
    logs = section(md, "### Full logs")
    assert f"Log directory: `{log_dir}` on 2 nodes ({HEAD_IP}, {NODE2});" in logs
    head, node2 = logs.index(f"**Node {HEAD_IP}**:"), logs.index(f"**Node {NODE2}**:")
    assert head < node2
    assert f"actor: {log_dir}/actor.log" in logs[head:node2]
    assert f"rollout: {log_dir}/rollout.log" in logs[head:node2]
    assert "rank 1 step 2 all_reduce_grads" in logs[head:node2]
    assert "rank 3 step 2 failed: RuntimeError: loss is nan" in logs[node2:]
    assert "rank 3 step 2 failed" not in logs[head:node2] and "rollout" not in logs[node2:]
    assert f"every role: {log_dir}/merged.log" in logs[node2:]
    assert "***(wandb_api_key)" in logs[node2:]
    assert {f"logs/{HEAD_IP}/rollout.log", f"logs/{NODE2}/actor.log",
            f"logs/{HEAD_IP}/merged.log", f"logs/{NODE2}/merged.log"} <= set(files)  # fmt: skip
    assert b"rank 2 step 2" in files[f"logs/{NODE2}/actor.log"]
    # Environment: read on each node from the ranks' interpreter; the same on both here.
    env_text = section(md, "### Environment")
    assert f"All 2 nodes ({HEAD_IP}, {NODE2}) agree:" in env_text
    assert f"- Python {platform.python_version()} " in env_text
    assert f"torch {torch.__version__} (CUDA none, NCCL not found)" in env_text
    assert "NCCL_DEBUG=INFO" in env_text and "WANDB_API_KEY=***" in env_text
    assert "HF_TOKEN=***" in env_text
    versions = {v["node"]: v for v in json.loads(files["versions.json"])}
    assert sorted(versions) == [HEAD_IP, NODE2]
    for node, v in versions.items():
        pids = sorted(r["pid"] for r in stacks["ranks"] if r["node"] == node)
        assert sorted(i["pid"] for i in v["interpreters"]) == pids
    # The rank variables as each node's ranks have them: the raylet's PID is its node's.
    assert "\nMASTER_ADDR=127.0.0.2\n" in env_text
    raylet = {n: v["interpreters"][0]["environment"]["RAY_RAYLET_PID"] for n, v in versions.items()}
    assert (
        f"\nRAY_RAYLET_PID={raylet[HEAD_IP]}\n" if raylet[HEAD_IP] == raylet[NODE2]
        else f"\nRAY_RAYLET_PID: {raylet[HEAD_IP]} on {HEAD_IP}; {raylet[NODE2]} on {NODE2}\n"
    ) in env_text  # fmt: skip
    # Script: rank 0's command line as Ray titles it; config.yaml from the head, masked.
    script = section(md, "### Script")
    rank0 = next(r for r in stacks["ranks"] if r["rank"] == 0)
    assert f"Command line of rank 0 (pid {rank0['pid']} on {HEAD_IP})" in script
    assert f"{HEAD_IP}:{log_dir}/config.yaml" in script
    assert "wandb_api_key: '***'" in script and "hf_token: '***'" in script
