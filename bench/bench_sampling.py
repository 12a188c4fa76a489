"""The console's cost of sampling over time: 4,096 processes (512 nodes x 8 ranks) at 1 Hz.

    PYTHONPATH=tui:agents:. python -m bench.bench_sampling [--nodes 512] [--ranks 8] [--samples 120]

Each second the console receives one agent `sample` per node and, as the Cluster screen's
monitor does (core/connection/monitor.py), decodes it, types it into rows, records the
processes' RSS readings and the GPUs' utilisation into its `SampleHistory` (the
*recording*) and, every TRENDS_EVERY (5) seconds, works out every process's RSS sparkline
and memory-growth check (`memory_trends`) and the ranks whose GPUs idle (the *verdicts*,
per second: their cost / 5).

Two paths run side by side on the same replies, each with its own history, timed in CPU
time second by second (medians):

- *old*: the code before the incremental path (bench/sampling_before.py, the previous
  core/connection/sampling.py unchanged) as the monitor called it: every record typed in
  full (`sample_rows(data)`), `add_node` from per-process tuples, `add_gpu_readings` from
  per-GPU and per-rank tuples, every process's trend one by one, `gpu_spread()` (a record
  for every rank);
- *new*: rows typed again only where more than the readings changed
  (`sample_rows(data, previous)`), `add_rows` and `add_gpu_rows` straight from the rows
  (the GPU readings added up when a verdict is asked for), the trends of a node's
  processes worked out together in array operations (core/connection/rss_window.py),
  `idle_ranks()` (records only for ranks at or below the idle threshold).

- *readings*: the new path fed as the Cluster screen's monitor is fed now: each node's
  stream asked for with `delta` (agent/readings.py, run here on the agent's side, not
  timed) sends its first sample whole and then only the readings while nothing else
  changes; the console decodes those and puts them into the rows of the last whole
  sample (`records.with_readings`). Recording and verdicts as *new*.

The baseline, in the same run, is `json.loads` of the whole replies. One
process in eight grows 2 MiB a second (the growth check's full test runs for it); one
rank's GPU idles. Both paths must reach the same verdicts; the bench checks that they do.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from areal_console.core.connection.monitor import TRENDS_EVERY, sample_rows
from areal_console.core.connection.records import ProcessRow, with_readings
from areal_console.core.connection.sampling import SampleHistory, memory_trends
from areal_node.agent.readings import DeltaStream

from bench import sampling_before


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
    names = [f"gpu{n}" for n in range(args.nodes)]
    old_history, new_history = sampling_before.SampleHistory(), SampleHistory()
    rows_before: dict[str, tuple[ProcessRow, ...]] = {}
    clock = time.process_time

    def old(replies: list[str], s: int) -> tuple[float, float, float]:
        t0 = clock()
        typed = [sample_rows(json.loads(r)) for r in replies]
        t1 = clock()
        for name, (procs, gpus, _) in zip(names, typed, strict=True):
            facts = ((p.pid, p.cmdline, p.rss, p.rank, p.role) for p in procs)
            old_history.add_node(name, facts, float(s))
            utils = [(g.index, float(g.util)) for g in gpus if g.util is not None]
            if utils:
                ranks = [(p.pid, p.rank, p.gpus, None if p.gpu_memory is None else int(p.gpu_memory))
                         for p in procs if p.rank is not None and p.gpus]  # fmt: skip
                old_history.add_gpu_readings(name, utils, ranks)
        t2 = clock()
        sampling_before.memory_trends(old_history, old_history.rss)
        old_history.gpu_spread()
        return t1 - t0, t2 - t1, clock() - t2

    def new(replies: list[str], s: int) -> tuple[float, float, float]:
        t0 = clock()
        typed = [
            sample_rows(json.loads(r), rows_before.get(name, ()))
            for name, r in zip(names, replies, strict=True)
        ]
        t1 = clock()
        for name, (procs, gpus, _) in zip(names, typed, strict=True):
            rows_before[name] = procs
            new_history.add_rows(name, procs, float(s))
            new_history.add_gpu_rows(name, gpus, procs)
        t2 = clock()
        memory_trends(new_history)
        new_history.idle_ranks()
        return t1 - t0, t2 - t1, clock() - t2

    streams = {name: DeltaStream() for name in names}
    delta_history = SampleHistory()
    delta_rows: dict[str, tuple[tuple[ProcessRow, ...], tuple[object, ...]]] = {}

    def readings(events: list[str], s: int) -> tuple[float, float, float]:
        t0 = clock()
        typed = []
        for name, line in zip(names, events, strict=True):
            event = json.loads(line)
            if "data" in event:
                procs, gpus, _ = sample_rows(event["data"], delta_rows.get(name, ((), ()))[0])
            else:
                held = delta_rows[name]
                fitted = with_readings(held[0], held[1], event["readings"])  # type: ignore[arg-type]
                assert fitted is not None
                procs, gpus = fitted
            typed.append((procs, gpus))
        t1 = clock()
        for name, (procs, gpus) in zip(names, typed, strict=True):
            delta_rows[name] = (procs, gpus)
            delta_history.add_rows(name, procs, float(s))
            delta_history.add_gpu_rows(name, gpus, procs)  # type: ignore[arg-type]
        t2 = clock()
        memory_trends(delta_history)
        delta_history.idle_ranks()
        return t1 - t0, t2 - t1, clock() - t2

    def decode(replies: list[str]) -> float:
        t0 = clock()
        for r in replies:
            json.loads(r)
        return clock() - t0

    def second(s: int) -> tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        samples = [node_sample(n, args.ranks, s) for n in range(args.nodes)]
        replies = [json.dumps(sample) for sample in samples]
        events = [
            json.dumps({"event": "sample", "stream": 1, **streams[name].event(sample)})
            for name, sample in zip(names, samples, strict=True)
        ]
        # A garbage collection (untimed) before each path: otherwise one of the three
        # histories' collection falls, at the same point every second, into whichever path
        # allocates past the threshold, and is counted as that path's cost.
        timed = []
        for path, arg in ((old, replies), (new, replies), (readings, events)):
            gc.collect()
            timed.append(path(arg, s))
        gc.collect()
        return decode(replies), *timed  # type: ignore[return-value]

    for s in range(args.samples):
        second(s)
    runs = [second(s) for s in range(args.samples, args.samples + args.repeats)]

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    base = ms([r[0] for r in runs])
    print(f"processes {args.nodes * args.ranks}, {args.samples} s of history, "
          f"median of {args.repeats} seconds (CPU ms per second; verdicts every "
          f"{TRENDS_EVERY:g} s, counted / {TRENDS_EVERY:g})")  # fmt: skip
    print(f"baseline json.loads          {base:8.2f}")
    print(f"{'':28} {'old':>8} {'new':>8} {'new/old':>8} {'readings':>9} {'/old':>6}")
    totals = {}
    for path, i in (("old", 1), ("new", 2), ("readings", 3)):
        rows, record, verdicts = (ms([r[i][k] for r in runs]) for k in range(3))
        totals[path] = (rows, record, verdicts / TRENDS_EVERY)
    for k, label in enumerate(("decode + rows", "recording", "verdicts")):
        o, n, d = totals["old"][k], totals["new"][k], totals["readings"][k]
        print(f"{label:28} {o:8.2f} {n:8.2f} {n / o:8.2f} {d:9.2f} {d / o:6.2f}")
    for label, part in (("added (recording+verdicts)", slice(1, 3)), ("all sampling", slice(0, 3))):
        o, n = sum(totals["old"][part]), sum(totals["new"][part])
        d = sum(totals["readings"][part])
        print(f"{label:28} {o:8.2f} {n:8.2f} {n / o:8.2f} {d:9.2f} {d / o:6.2f}   "
              f"share of a core: old {o / 10:.2f}%, new {n / 10:.2f}%, "
              f"readings {d / 10:.2f}%; readings / baseline {d / base:.2f}")  # fmt: skip
    old_trends = sampling_before.memory_trends(old_history, old_history.rss)
    new_trends = memory_trends(new_history)
    same = {k: (t.spark, t.growth and t.growth.to_json()) for k, t in old_trends.items()} == {
        k: (t.spark, t.growth and t.growth.to_json()) for k, t in new_trends.items()
    }
    assert same, "the two paths' trends differ"
    delta_trends = memory_trends(delta_history)
    assert {k: (t.spark, t.growth and t.growth.to_json()) for k, t in delta_trends.items()} == {
        k: (t.spark, t.growth and t.growth.to_json()) for k, t in new_trends.items()
    }, "the readings path's trends differ"
    old_idle = [i.to_json() for i in old_history.gpu_spread()[1]]
    assert old_idle == [i.to_json() for i in new_history.idle_ranks()], "idle ranks differ"
    assert [i.to_json() for i in delta_history.idle_ranks()] == old_idle, "idle ranks differ"
    agent_side(args.samples)
    growing = sum(1 for t in new_trends.values() if t.growth)
    print(
        f"flagged (same on all three paths): {growing} growing, "
        f"{len(new_history.idle_ranks())} idle GPU rank(s)"
    )


def agent_side(samples: int) -> None:
    """What a `delta` stream costs the agent, on its node: deciding whole or readings and
    writing the event, against writing the whole sample, per sample (CPU, medians)."""
    for ranks in (8, 1000):
        seconds = [node_sample(0, ranks, s) for s in range(samples)]
        stream = DeltaStream()
        stream.event(seconds[0])
        whole, delta = [], []
        for sample in seconds[1:]:
            t0 = time.process_time()
            json.dumps({"event": "sample", "stream": 1, "data": sample})
            t1 = time.process_time()
            json.dumps({"event": "sample", "stream": 1, **stream.event(sample)})
            whole.append(t1 - t0)
            delta.append(time.process_time() - t1)
        w, d = statistics.median(whole) * 1e3, statistics.median(delta) * 1e3
        print(f"agent side, {ranks} processes a node: whole event {w:.3f} ms, "
              f"delta event {d:.3f} ms per sample ({d / w:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
