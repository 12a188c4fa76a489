"""The console's cost of sampling over time: 4,096 processes (512 nodes x 8 ranks) at 1 Hz.

    PYTHONPATH=tui:agents:. python -m bench.bench_sampling [--nodes 512] [--ranks 8] [--samples 120]

Each second the console receives one agent `sample` per node. What sampling over time adds,
as the Cluster screen's monitor does it (core/connection/monitor.py): per node and sample,
the processes' RSS readings and ranks into `SampleHistory.add_node` and the GPUs'
utilisation into `add_gpu_readings` (the *recording*); every TRENDS_EVERY (5) seconds,
every process's RSS sparkline and memory-growth check (`memory_trends`) and the GPU
spread (`gpu_spread`) (the *verdicts*, per second: their cost / 5). The baseline, in the
same run, is what the console already does with each sample: decoding the agent's JSON
replies and typing them into rows (`sample_rows`). One process in eight grows 2 MiB a
second (the growth check's worst case runs for it); one rank's GPU idles. The history is
filled first (`--samples` seconds), then `--repeats` seconds are timed in CPU time
(medians); the result is the share of one core at 1 Hz.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from areal_console.core.connection.monitor import TRENDS_EVERY, sample_rows
from areal_console.core.connection.sampling import SampleHistory, memory_trends


def node_sample(node: int, ranks: int, second: int) -> dict[str, object]:
    """An agent `sample` reply as it arrives: GPUs and rank processes (NVML fields as an
    H200 node reports them, tests/data/h200-nodes.json)."""
    gpus, procs = [], []
    for i in range(ranks):
        rank = node * ranks + i
        grows = rank % 8 == 3
        gpus.append({"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{rank:08x}",
                     "util": 0 if rank == 5 else 100, "mem_used": 7975337984,
                     "mem_total": 150754820096, "temp": 58, "power": 651.0})  # fmt: skip
        procs.append({"pid": 10_000 + i, "ppid": 1, "cmdline": f"python3 -m areal.train r{rank}",
                      "rank": rank, "local_rank": i, "world_size": 4096, "role": "trainer",
                      "job": None, "worker_index": None, "server": None, "cpu_percent": 96.4,
                      "rss": 825106432 + (second * (1 << 21) if grows else (second % 3) << 12),
                      "state": "R", "gpus": [i], "gpu_memory": 7321157632})  # fmt: skip
    return {"time": float(second), "hostname": f"gpu{node}", "gpus": gpus, "gpu_error": None,
            "processes": procs}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=120, help="seconds of history first")
    ap.add_argument("--repeats", type=int, default=10, help="seconds timed")
    args = ap.parse_args()
    history = SampleHistory()
    names = [f"gpu{n}" for n in range(args.nodes)]

    def second(s: int) -> tuple[float, float, float]:
        replies = [json.dumps(node_sample(n, args.ranks, s)) for n in range(args.nodes)]
        t0 = time.process_time()
        typed = [sample_rows(json.loads(r)) for r in replies]
        t1 = time.process_time()
        for name, (procs, gpus, _) in zip(names, typed, strict=True):
            facts = ((p.pid, p.cmdline, p.rss, p.rank, p.role) for p in procs)
            history.add_node(name, facts, float(s))
            utils = [(g.index, float(g.util)) for g in gpus if g.util is not None]
            ranks = [(p.pid, p.rank, p.gpus, None) for p in procs if p.rank is not None and p.gpus]
            history.add_gpu_readings(name, utils, ranks)
        t2 = time.process_time()
        memory_trends(history, history.rss)
        history.gpu_spread()
        t3 = time.process_time()
        return t1 - t0, t2 - t1, t3 - t2

    for s in range(args.samples):
        second(s)
    runs = [second(s) for s in range(args.samples, args.samples + args.repeats)]
    base, record, verdicts = (statistics.median(r[i] for r in runs) * 1e3 for i in range(3))
    per_second = record + verdicts / TRENDS_EVERY
    growing = sum(1 for t in memory_trends(history, history.rss).values() if t.growth)
    idle = len(history.gpu_spread()[1])
    print(f"processes {args.nodes * args.ranks}, {args.samples} s of history, "
          f"median of {args.repeats} seconds (CPU ms)")  # fmt: skip
    print(f"baseline (decode + rows) {base:8.2f}")
    print(f"recording                {record:8.2f}   ratio {record / base:5.2f}")
    print(f"verdicts (every {TRENDS_EVERY:g} s)    {verdicts:8.2f}   ratio {verdicts / base:5.2f}")
    print(f"added per second         {per_second:8.2f}   ratio {per_second / base:5.2f}   "
          f"{per_second / 10:.2f}% of a core")  # fmt: skip
    print(f"flagged: {growing} growing, {idle} idle GPU rank(s)")


if __name__ == "__main__":
    main()
