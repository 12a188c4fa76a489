"""Fleet fan-out over real sshd nodes: time to first sample for N nodes, and console CPU.

    python bench/bench_fleet.py [--nodes 16] [--repeats 3] [--steady-seconds 20]

Starts a local test cluster (root and openssh-server needed; see tests/support/cluster.py), then
1. for N = 1, 2, 4, 8, 16: time from creating a `Fleet` to having one `sample` from every
   node (SSH connect + host key check + auth + agent bootstrap + handshake + sample), cold
   (agent not yet cached on the nodes) once and warm (cached) `--repeats` times; the ratio
   to N = 1 is the figure of merit (parallel fan-out: 16 nodes should cost <= 3x one);
2. console CPU (this process, all threads) over `--steady-seconds` with every node
   sampled at 1 Hz, both by polling (`call_all("sample")` each second, as the Cluster
   screen does) and by agent-side streams (`stream` events), against an idle connected
   fleet as the baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.fleet import Fleet, NodeFailure  # noqa: E402
from areal_console.core.targets.resolve import NodeSpec  # noqa: E402

from tests.support.cluster import TestCluster, skip_reason  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def busy_cpu_seconds() -> float:
    """CPU seconds spent by the whole machine (all processes: console, sshd, agents)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def first_sample(cluster: TestCluster, n: int, python: str | None) -> float:
    """Seconds from nothing to one sample from each of the first n nodes."""
    return time_first_sample(cluster.specs(python)[:n], **cluster.ssh_options())


def time_first_sample(specs: list[NodeSpec], **options: Any) -> float:
    """Seconds from a new fleet to one sample from each of `specs` (all must answer)."""
    t0 = time.perf_counter()
    fleet = Fleet(specs, **options)
    try:
        results = fleet.call_all("sample")
        elapsed = time.perf_counter() - t0
    finally:
        fleet.close()
    failed = [r for r in results.values() if isinstance(r, NodeFailure)]
    if failed:
        raise RuntimeError(f"nodes failed: {failed}")
    return elapsed


def sequential_first_sample(cluster: TestCluster, n: int, python: str | None) -> float:
    """The baseline without fan-out: the same work, one node after the other."""
    t0 = time.perf_counter()
    for spec in cluster.specs(python)[:n]:
        fleet = Fleet([spec], **cluster.ssh_options())
        try:
            result = fleet.call_all("sample")[spec.name]
        finally:
            fleet.close()
        if isinstance(result, NodeFailure):
            raise RuntimeError(str(result))
    return time.perf_counter() - t0


def behind_jump(cluster: TestCluster, share: bool) -> float:
    """Seconds to a first sample from every other node, all reached through node1."""
    jump = cluster.nodes[0]
    config = Path(str(cluster.ssh_config) + ".jump")
    blocks = [cluster.ssh_config.read_text()]
    for node in cluster.nodes[1:]:
        blocks.append(
            f"Host via-{node.name}\n    HostName {node.address}\n    Port {node.port}\n"
            f"    User root\n    IdentityFile {cluster.identity}\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {cluster.known_hosts}\n    ProxyJump {jump.name}\n"
        )
    config.write_text("\n".join(blocks))
    specs = [
        NodeSpec(name=n.name, transport="ssh", host=f"via-{n.name}") for n in cluster.nodes[1:]
    ]
    return time_first_sample(specs, ssh_config=str(config), allow_agent=False, share_jumps=share)


def steady_cpu(
    cluster: TestCluster, seconds: float, mode: str, python: str | None
) -> dict[str, Any]:
    """Console CPU percent (of one core) while every node is sampled at 1 Hz."""
    samples = 0
    lock = threading.Lock()

    def on_event(_session: Any, message: dict[str, Any]) -> None:
        nonlocal samples
        if message.get("event") == "sample":
            with lock:
                samples += 1

    fleet = Fleet(cluster.specs(python), on_event=on_event, **cluster.ssh_options())
    try:
        connected = fleet.connect_all()
        assert not any(isinstance(r, NodeFailure) for r in connected.values()), connected
        if mode == "stream":
            fleet.call_all("stream", {"interval": 1.0})
        time.sleep(1.0)  # let startup work settle before measuring
        c0, t0 = cpu_seconds(), time.perf_counter()
        with lock:
            samples_before = samples
        polls = 0
        next_at = t0
        while time.perf_counter() - t0 < seconds:
            if mode == "poll":
                results = fleet.call_all("sample")
                polls += sum(not isinstance(r, NodeFailure) for r in results.values())
            next_at += 1.0
            time.sleep(max(0.0, next_at - time.perf_counter()))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
    finally:
        fleet.close()
    got = polls if mode == "poll" else samples - samples_before
    return {"mode": mode, "cpu_percent": 100.0 * cpu / wall, "samples": got, "wall": wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument(
        "--python",
        default=None,
        help="the nodes' Python for the agent (default: python3 on the node's PATH)",
    )
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= args.nodes]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        os.environ["AREAL_CONSOLE_DATA_DIR"] = str(Path(tmp) / "data")
        with TestCluster(Path(tmp) / "cluster", nodes=args.nodes) as cluster:
            print(f"machine: {os.cpu_count()} CPUs, {args.nodes} sshd nodes on loopback")
            py = args.python
            print(f"node python: {py or 'python3 (PATH: ' + os.path.dirname(sys.executable) + ')'}")
            cold = first_sample(cluster, args.nodes, py)  # ships the agent to every node once
            print(f"cold start, {args.nodes} nodes (agent shipped): {cold:.3f}s")
            # Rounds go over every N in turn, so load from elsewhere hits all N alike.
            runs: dict[int, list[float]] = {n: [] for n in sizes}
            busy: dict[int, float] = dict.fromkeys(sizes, 0.0)
            for _ in range(args.repeats):
                for n in sizes:
                    busy0 = busy_cpu_seconds()
                    runs[n].append(first_sample(cluster, n, py))
                    busy[n] += busy_cpu_seconds() - busy0
            medians = {n: statistics.median(r) for n, r in runs.items()}
            best = {n: min(r) for n, r in runs.items()}
            print(f"\nwarm runs: {args.repeats} rounds over N")
            print("N    median   ratio    best    ratio   machine CPU per node")
            for n in sizes:
                print(
                    f"{n:<4} {medians[n]:.3f}s  {medians[n] / medians[sizes[0]]:4.2f}x  "
                    f"{best[n]:.3f}s  {best[n] / best[sizes[0]]:4.2f}x   "
                    f"{busy[n] / args.repeats / n * 1000:.0f} ms"
                )
            behind = len(cluster.nodes) - 1
            if behind >= 2:
                shared = statistics.median(behind_jump(cluster, True) for _ in range(args.repeats))
                separate = statistics.median(
                    behind_jump(cluster, False) for _ in range(args.repeats)
                )
                print(
                    f"\n{behind} nodes behind one jump host: shared jump connection "
                    f"{shared:.3f}s, one jump connection per node {separate:.3f}s "
                    f"({separate / shared:.2f}x)"
                )
            print(f"\nconsole CPU, {args.nodes} nodes, {args.steady_seconds:g}s each:")
            base = steady_cpu(cluster, args.steady_seconds, "idle", py)
            print(f"  idle (connected, not sampling): {base['cpu_percent']:.2f}% of a core")
            for mode in ("poll", "stream"):
                r = steady_cpu(cluster, args.steady_seconds, mode, py)
                rate = r["samples"] / r["wall"]
                print(
                    f"  {mode:<6} 1 Hz: {r['cpu_percent']:.2f}% of a core "
                    f"({rate:.1f} samples/s received, {r['cpu_percent'] - base['cpu_percent']:+.2f}"
                    " points over idle)"
                )
            largest = max(sizes)
            busy0, t0 = busy_cpu_seconds(), time.perf_counter()
            parallel = first_sample(cluster, largest, py)
            busy = (busy_cpu_seconds() - busy0) / (
                (time.perf_counter() - t0) * (os.cpu_count() or 1)
            )
            sequential = sequential_first_sample(cluster, largest, py)
            print(
                f"\n{largest} nodes: parallel {parallel:.3f}s (machine {100 * busy:.0f}% busy on "
                f"all cores), sequential {sequential:.3f}s: fan-out is "
                f"{sequential / parallel:.1f}x faster"
            )
            verdict = "ok" if medians[largest] <= 3 * medians[sizes[0]] else "SLOW"
            print(
                f"\n{largest} nodes / 1 node = {medians[largest] / medians[sizes[0]]:.2f}x "
                f"(target <= 3x): {verdict}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
