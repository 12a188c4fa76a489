"""Gathering across every node of a Slurm job: one shared srun step vs one channel per node.

    python bench/bench_slurm.py [--nodes 16] [--rounds 3]

Starts a real Slurm cluster on this machine (tests/support/slurm_cluster.py: one slurmd per node in
its own namespaces; needs root and slurm-wlm + munge), submits a job with one rank-like
Python process per node, then measures in the same run, for both forms:

- cold: connect to every node + `sample` + a py-spy capture of every rank (what one
  keystroke costs when the console opens a job), its wall time, and the console's CPU for
  it (this process, and its srun or ssh children, through the close that reaps them);
- warm: `sample` + capture again over the open channels;
- what it leaves on the console's side: srun processes (one per channel, or one in all).

"one step" is the default form (`--slurm-mode step`): one `srun --overlap` step runs the
agent on all nodes, multiplexed on one stdio. "per node" (`--slurm-mode node`) opens one srun
step per node, which is also what one SSH connection per node costs in processes and
connection setups on the console's side.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.fleet import Fleet, NodeFailure  # noqa: E402
from areal_console.core.slurm.client import SshLoginRunner  # noqa: E402
from areal_console.core.slurm.targets import resolve_slurm_targets  # noqa: E402

from tests.support.login_sshd import LoginHost  # noqa: E402
from tests.support.slurm_cluster import (  # noqa: E402
    SlurmCluster,
    SlurmStartError,
    SlurmUnavailable,
    start_cluster,
)

# A rank-like process per node: RANK etc. in its environment, as torchrun or srun set them.
RANK_JOB = """#!/bin/bash
exec srun --kill-on-bad-exit=0 bash -c \
  'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec "$0" -c "$1"' \
  "{python}" "import time; time.sleep(3600)"
"""


def srun_children() -> int:
    """srun (or ssh) processes that are children of this process: the channels' console side."""
    me = os.getpid()
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if comm in ("srun", "ssh") and ppid == me:
            count += 1
    return count


def gather(fleet: Fleet) -> dict[str, Any]:
    """sample + py-spy of every rank on every node, all nodes in parallel."""

    def one(session: Any) -> Any:
        sample = session.call("sample", {}, timeout=120)
        pids = [p["pid"] for p in sample["processes"] if p["rank"] is not None]
        return session.call("pyspy", {"pids": pids, "nonblocking": True}, timeout=120)

    return fleet.fan_out(one)


def check(results: dict[str, Any], nodes: int) -> None:
    failures = [r for r in results.values() if isinstance(r, NodeFailure)]
    ok = sum(1 for r in results.values() if not isinstance(r, NodeFailure) and r["dumps"])
    if failures or ok != nodes:
        raise SystemExit(f"gather failed: {ok}/{nodes} nodes, {failures[:3]}")


def console_cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its reaped children (srun, ssh, squeue)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def measure(
    job_id: str, mode: str, nodes: int, rounds: int, runner: Any = None
) -> dict[str, float]:
    cold, warm, cpu, kids_cpu, sruns = [], [], [], [], 0
    login = runner.login if runner is not None else None
    for _ in range(rounds):
        # Cold: resolve the job, connect, sample + capture, close (the console-side srun
        # or ssh processes are reaped at close, so their CPU is counted then).
        cpu0, kids0 = console_cpu()
        t0 = time.perf_counter()
        plan = resolve_slurm_targets(job_id, login=login, mode=mode, runner=runner)
        fleet = Fleet(plan.specs, slurm_runner=runner)
        try:
            results = gather(fleet)
            cold.append(time.perf_counter() - t0)
            check(results, nodes)
            sruns = max(sruns, srun_children())
        finally:
            fleet.close()
        cpu1, kids1 = console_cpu()
        cpu.append(cpu1 - cpu0)
        kids_cpu.append(kids1 - kids0)
        # Warm: the same over open channels.
        fleet = Fleet(plan.specs, slurm_runner=runner)
        try:
            check(gather(fleet), nodes)
            for _ in range(3):
                t1 = time.perf_counter()
                check(gather(fleet), nodes)
                warm.append(time.perf_counter() - t1)
        finally:
            fleet.close()
    return {
        "cold": statistics.median(cold),
        "warm": statistics.median(warm),
        "cpu": statistics.median(cpu),
        "kids_cpu": statistics.median(kids_cpu),
        "sruns": float(sruns),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="bench-slurm-home-")
    os.environ["HOME"] = home  # the agents cache their source under ~/.cache
    try:
        cluster: SlurmCluster = start_cluster(args.nodes)
    except SlurmUnavailable as exc:
        raise SystemExit(f"no Slurm here: {exc}") from exc
    except SlurmStartError as exc:
        raise SystemExit(f"error: the Slurm cluster did not start: {exc}") from exc
    try:
        os.environ["SLURM_CONF"] = str(cluster.conf)
        job = str(
            cluster.sbatch(
                RANK_JOB.format(python=sys.executable),
                f"--nodes={args.nodes}",
                "--ntasks-per-node=1",
                "--output=/dev/null",
            )
        )
        cluster.wait_job_state(job, ("RUNNING",))
        time.sleep(1.0)  # let the ranks exec (no ready file: they only sleep)
        # Warm the agent cache on every node once, outside the measurement.
        measure(job, "step", args.nodes, 1)
        rows = [
            (
                "here",
                measure(job, "step", args.nodes, args.rounds),
                measure(job, "node", args.nodes, args.rounds),
            ),
        ]
        login = LoginHost(Path(home) / "login", cluster.conf).start()
        try:
            shared = SshLoginRunner(login.login, options=login.client_options())
            separate = SshLoginRunner(login.login, options=login.client_options(), multiplex=False)
            rows.append(
                (
                    "via ssh login host",
                    measure(job, "step", args.nodes, args.rounds, shared),
                    measure(job, "node", args.nodes, args.rounds, separate),
                )
            )
            shared.close()
        finally:
            login.stop()
        print(
            f"nodes: {args.nodes} slurmd (one rank each), rounds: {args.rounds}, cores: {os.cpu_count()}"
        )
        print(f"{'':58}{'one step':>10}{'per node':>10}{'ratio':>8}")
        for where, step, per_node in rows:
            for key, label in (
                ("cold", "connect+sample+capture (s)"),
                ("warm", "sample+capture (s)"),
            ):
                ratio = per_node[key] / step[key]
                print(
                    f"{where + ': ' + label:58}{step[key]:10.3f}{per_node[key]:10.3f}{ratio:7.2f}x"
                )
            for key, label in (
                ("cpu", "cold: console process CPU (s)"),
                ("kids_cpu", "cold: its srun/ssh children's CPU (s)"),
            ):
                ratio = per_node[key] / step[key] if step[key] else float("nan")
                print(
                    f"{where + ': ' + label:58}{step[key]:10.3f}{per_node[key]:10.3f}{ratio:7.2f}x"
                )
            print(
                f"{where + ': console-side processes':58}{step['sruns']:10.0f}{per_node['sruns']:10.0f}"
            )
    finally:
        cluster.cleanup()


if __name__ == "__main__":
    main()
