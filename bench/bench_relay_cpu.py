"""The console's CPU per node for a fan-out tree against flat, with real local agents.

    python bench/bench_relay_cpu.py [--nodes 18] [--fanout 2] [--cycles 3]

Each cycle is what a one-shot command does: a new fleet, connect and `sample` every node,
close. Flat: every node's agent is a child process of the console (`LocalChannel`). Tree:
the console starts `--fanout` agents; they start the others' agents (the same bootstrap,
as local processes: here the relay's hop is a process start, on a cluster it is `ssh`) and
relay their lines. Real: the console, the agents, the relays, pipes, the protocol. No SSH:
the handshake the tree saves on a cluster is measured in bench_scale.py --sshd.

Console CPU is this process's (getrusage), and per thread kind (thread CPU clocks), per
node per cycle, median of the cycles, after one warm-up cycle.
"""

from __future__ import annotations

import argparse
import collections
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT)]

from areal_console.core.connection.fleet import Fleet, NodeFailure  # noqa: E402
from areal_console.core.connection.transport import bootstrap_argv  # noqa: E402
from areal_console.core.targets.specs import NodeSpec  # noqa: E402

THREAD_CPU: collections.Counter[str] = collections.Counter()
_run = threading.Thread.run


def _counted_run(self: threading.Thread) -> None:
    t0 = time.thread_time()
    try:
        _run(self)
    finally:
        THREAD_CPU[self.name.split("-")[0].split(" ")[0]] += time.thread_time() - t0


threading.Thread.run = _counted_run  # type: ignore[method-assign]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cycle(nodes: int, fanout: int | None) -> None:
    specs = [NodeSpec(name=f"n{i}", transport="local") for i in range(nodes)]
    fleet = Fleet(
        specs, probe_gpus=False, fanout_tree=fanout,
        relay_argv=(lambda s: bootstrap_argv(sys.executable)) if fanout else None,
    )  # fmt: skip
    try:
        results = fleet.call_all("sample", {"cpu": False, "gpus": False})
    finally:
        fleet.close()
    failed = [r for r in results.values() if isinstance(r, NodeFailure)]
    if failed:
        raise SystemExit(f"nodes failed: {failed[:3]}")


def measure(nodes: int, fanout: int | None, cycles: int) -> tuple[float, dict[str, float]]:
    cycle(nodes, fanout)  # warm-up: imports, the payload built once
    time.sleep(1.0)
    per_cycle = []
    THREAD_CPU.clear()
    for _ in range(cycles):
        c0 = cpu_seconds()
        cycle(nodes, fanout)
        time.sleep(0.5)  # the agents' reapers finish inside the cycle's figure
        per_cycle.append(cpu_seconds() - c0)
    by_thread = {k: 1000 * v / cycles / nodes for k, v in THREAD_CPU.most_common(4)}
    return 1000 * statistics.median(per_cycle) / nodes, by_thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=18)
    parser.add_argument("--fanout", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    flat, flat_threads = measure(args.nodes, None, args.cycles)
    tree, tree_threads = measure(args.nodes, args.fanout, args.cycles)
    real = (
        "real: console, local agents, relays, pipes, protocol; no SSH (relay hop: a process start)"
    )
    print(f"{args.nodes} local nodes, connect + sample + close, median of {args.cycles} cycles")
    print(f"  flat          {flat:5.2f} ms console CPU per node  [{real}]")
    print(
        f"  tree K={args.fanout:<5} {tree:5.2f} ms console CPU per node  (tree / flat {tree / flat:.2f})"
    )
    for label, threads in (("flat", flat_threads), ("tree", tree_threads)):
        parts = ", ".join(f"{k} {v:.2f}" for k, v in threads.items())
        print(f"  {label} threads, ms per node: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
