"""The agent as a Ray actor against the agent over SSH, on the same Ray-placed job.

    flock /tmp/areal-heavy.lock python bench/bench_ray.py [--repeat 7] [--idle-seconds 20]

Starts the test Ray cluster (tests/support/ray_cluster.py: a head on 127.0.0.2 and a node on
127.0.0.3, each in its own PID namespace) and the 4-rank gloo job placed as Ray actors
(tests/jobs/ray_gloo.py, cleanup deadlock). An sshd is then started inside each Ray
node's namespaces (tests/support/cluster.py's node, entered with nsenter), so SSH sees exactly the
processes Ray's actors see. Measured in the same run:

- warm capture: `take_capture` (sample + py-spy of every rank + diagnosis) over open
  sessions, Ray actors vs SSH, interleaved, median of `--repeat`; the bar is <= 1.5x;
- cold start: the whole `stacks --ray --json` process vs `stacks --hosts --json` (ssh),
  interpreter start, imports, `ray.init`, actor placement included;
- idle cost on a node: the agent actor's process (its console connected, sampled by
  nobody) against an empty `num_cpus=0` actor on the same node, CPU share of a core and
  RSS over `--idle-seconds`; the bar is < 0.5% of a core and < 30 MB above the empty one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.fleet import Fleet, NodeFailure  # noqa: E402
from areal_console.core.ray.targets import resolve_ray_targets  # noqa: E402
from areal_console.core.stacks.capture import CaptureOptions, take_capture  # noqa: E402

from tests.support.cluster import TestCluster  # noqa: E402
from tests.support.fixtures.hang import free_port  # noqa: E402
from tests.support.ray_cluster import RayCluster, start_cluster  # noqa: E402
from tests.support.waits import wait_for  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def start_job(cluster: RayCluster) -> tuple[subprocess.Popen[bytes], Path]:
    state = Path(tempfile.mkdtemp(prefix="ray-gloo-", dir=cluster.base))
    argv = [sys.executable, str(ROOT / "tests/jobs/ray_gloo.py"), cluster.address]
    driver = subprocess.Popen(
        [*argv, "cleanup_deadlock", str(state), str(free_port()), str(ROOT), "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=cluster.env(),
    )
    wait_for(lambda: len(list(state.glob("rank*.ready"))) == 4, 120, "the Ray gloo ranks")
    return driver, state


def capture_seconds(fleet: Fleet) -> float:
    t0 = time.perf_counter()
    capture = take_capture(fleet, CaptureOptions(), save=False)
    elapsed = time.perf_counter() - t0
    ranks = sorted(r.rank for r in capture.rank_stacks if r.rank is not None)
    if ranks != [0, 1, 2, 3] or capture.errors:
        raise RuntimeError(f"capture incomplete: ranks {ranks}, errors {capture.errors}")
    return elapsed


def whole_process(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{argv[3:6]} exited {done.returncode}: {done.stderr[-500:]}")
    return elapsed


def host_pid(ns_pid: int, init: int) -> int:
    """The host PID of process `ns_pid` of the namespace whose init is `init`."""
    ns = os.readlink(f"/proc/{init}/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns/pid") != ns:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    raise LookupError(f"pid {ns_pid} not found in the namespace of {init}")


def cpu_and_rss(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


def idle_cost(cluster: RayCluster, seconds: float) -> dict[str, tuple[float, int]]:
    """CPU share and RSS of an idle agent actor (its console connected) and of an empty
    actor, both on the second node, over the same `seconds`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    plan = resolve_ray_targets(cluster.address)
    spec = plan.specs[-1]
    assert spec.ray is not None
    fleet = Fleet([spec])
    try:
        fleet.connect_all()
        channel: Any = fleet.session(spec.name).client.channel  # type: ignore[union-attr]
        agent_pid = channel.info["pid"]

        @ray.remote
        class Empty:
            def pid(self) -> int:
                return os.getpid()

        strategy = NodeAffinitySchedulingStrategy(spec.ray.node_id, soft=False)
        empty = Empty.options(num_cpus=0, scheduling_strategy=strategy).remote()  # type: ignore[attr-defined]
        empty_pid = ray.get(empty.pid.remote())
        init = cluster.ns_init(spec.host or "")
        pids = {"agent actor": host_pid(agent_pid, init), "empty actor": host_pid(empty_pid, init)}
        time.sleep(3)  # past the start
        before = {k: cpu_and_rss(p) for k, p in pids.items()}
        time.sleep(seconds)
        after = {k: cpu_and_rss(p) for k, p in pids.items()}
        ray.kill(empty)
        return {k: ((after[k][0] - before[k][0]) / seconds, after[k][1]) for k in pids}
    finally:
        fleet.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster = start_cluster(2)
    driver = None
    ssh = TestCluster(cluster.base / "ssh", nodes=2)
    try:
        driver, _ = start_job(cluster)
        cluster.start_sshd(ssh)
        ray_fleet = Fleet(resolve_ray_targets(cluster.address).specs)
        ssh_fleet = ssh.fleet()
        for fleet in (ray_fleet, ssh_fleet):
            failed = [r for r in fleet.connect_all().values() if isinstance(r, NodeFailure)]
            if failed:
                raise RuntimeError(f"nodes failed: {failed}")
            capture_seconds(fleet)  # warm: agents placed, py-spy paged in
        warm: dict[str, list[float]] = {"ray": [], "ssh": []}
        for _ in range(args.repeat):
            warm["ray"].append(capture_seconds(ray_fleet))
            warm["ssh"].append(capture_seconds(ssh_fleet))
        ray_fleet.close()
        ssh_fleet.close()
        env = ssh.env(cluster.env(PYTHONPATH=f"{ROOT / 'tui'}{os.pathsep}{ROOT / 'agents'}"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cluster.base / "pycache")
        env["AREAL_CONSOLE_DATA_DIR"] = str(cluster.base / "data")
        base = [sys.executable, "-m", "areal_console", "stacks", "--json"]
        cold: dict[str, list[float]] = {"ray": [], "ssh": []}
        for _ in range(max(3, args.repeat // 2)):
            cold["ray"].append(whole_process([*base, "--ray", cluster.address], env))
            cold["ssh"].append(whole_process([*base, "--hosts", ssh.hosts_arg()], env))
        idle = idle_cost(cluster, args.idle_seconds)
    finally:
        if driver is not None:
            driver.terminate()
            driver.wait(timeout=30)
        ssh.stop()
        cluster.stop()
    ray_w, ssh_w = statistics.median(warm["ray"]), statistics.median(warm["ssh"])
    ray_c, ssh_c = statistics.median(cold["ray"]), statistics.median(cold["ssh"])
    print(f"warm capture, 4 ranks on 2 nodes (median of {args.repeat}):")
    print(
        f"  ray actors {ray_w * 1000:7.1f} ms   ssh {ssh_w * 1000:7.1f} ms   ratio {ray_w / ssh_w:.2f}x"
    )
    print(f"cold `stacks --json`, whole process (median of {len(cold['ray'])}):")
    print(
        f"  --ray      {ray_c * 1000:7.1f} ms   --hosts (ssh) {ssh_c * 1000:7.1f} ms   ratio {ray_c / ssh_c:.2f}x"
    )
    print(f"idle on one node over {args.idle_seconds:g} s (console connected, no requests):")
    for name, (share, rss) in idle.items():
        print(f"  {name:12s} {share * 100:5.2f}% of a core   RSS {rss / 2**20:6.1f} MB")
    agent, empty = idle["agent actor"], idle["empty actor"]
    print(
        f"  agent above empty: {(agent[0] - empty[0]) * 100:+.2f}% of a core, "
        f"{(agent[1] - empty[1]) / 2**20:+.1f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
