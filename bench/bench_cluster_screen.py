"""Cluster screen refresh cost at 128 nodes x 8 GPUs x 8 ranks, updated in place vs rebuilt.

    python bench/bench_cluster_screen.py [--nodes 128] [--ticks 20]

Each tick changes every GPU's utilisation and every rank's CPU% (the worst case of a 1 Hz
sample), then times `ClusterScreen.refresh_view()` (keyed rows, `update_cell` only for
changed cells) against a baseline that clears and refills both tables, as a naive view
would, in the same run and the same headless Textual app.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents")]

from areal_console.app import ConsoleApp  # noqa: E402
from areal_console.core.monitor import NodeView, RecordedMonitor  # noqa: E402
from areal_console.screens.cluster import ClusterScreen  # noqa: E402
from areal_console.widgets.node_table import NodeTable  # noqa: E402
from areal_console.widgets.process_table import ProcessTable  # noqa: E402

RECORDING = ROOT / "tests" / "data" / "cluster_recording.json"


def synthetic_cluster(nodes: int) -> list[NodeView]:
    """`nodes` copies of a recorded 8-GPU node, with 8 ranks each and distinct pids/ranks."""
    base = json.loads(RECORDING.read_text())
    template = next(p for p in base["processes"] if p["rank"] is not None)
    views = []
    for n in range(nodes):
        sample = copy.deepcopy(base)
        sample["processes"] = []
        for local in range(8):
            p = dict(template)
            p.update(pid=10_000 + n * 10 + local, rank=n * 8 + local, local_rank=local,
                     world_size=nodes * 8, gpus=[local])  # fmt: skip
            sample["processes"].append(p)
        history = {g["index"]: deque([50.0] * 60, maxlen=60) for g in sample["gpus"]}
        views.append(NodeView(f"node{n:03d}", f"10.0.{n // 250}.{n % 250}", "up", None, 0.003,
                              sample, 0.0, history))  # fmt: skip
    return views


def tick(views: list[NodeView], t: int) -> None:
    for i, v in enumerate(views):
        assert v.sample is not None
        for g in v.sample["gpus"]:
            g["util"] = (t * 7 + i + g["index"]) % 100
        for p in v.sample["processes"]:
            p["cpu_percent"] = float((t * 3 + p["rank"]) % 100)


async def measure(nodes: int, ticks: int) -> tuple[list[float], list[float]]:
    views = synthetic_cluster(nodes)
    app = ConsoleApp(None, RecordedMonitor(views), refresh_interval=3600)
    in_place: list[float] = []
    rebuilt: list[float] = []
    async with app.run_test(size=(160, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        await pilot.pause()
        screen.action_back()
        procs = screen.query_one(ProcessTable)
        node_table = screen.query_one(NodeTable)
        for t in range(ticks):
            tick(views, t)
            t0 = time.perf_counter()
            screen.refresh_view()
            await pilot.pause()  # include the redraw
            in_place.append(time.perf_counter() - t0)
        assert procs.row_count == nodes * 8, procs.row_count
        for t in range(ticks):
            tick(views, t + ticks)
            t0 = time.perf_counter()
            procs.clear()
            node_table.clear()
            screen.refresh_view()
            await pilot.pause()
            rebuilt.append(time.perf_counter() - t0)
    return in_place, rebuilt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    in_place, rebuilt = asyncio.run(measure(args.nodes, args.ticks))
    med = statistics.median
    print(f"{args.nodes} nodes x 8 GPUs, {args.nodes * 8} rank rows, {args.ticks} ticks each")
    print(
        f"refresh in place: median {med(in_place) * 1000:.1f} ms, max {max(in_place) * 1000:.1f} ms"
    )
    print(
        f"rebuild baseline: median {med(rebuilt) * 1000:.1f} ms, max {max(rebuilt) * 1000:.1f} ms"
    )
    print(f"ratio rebuild / in place: {med(rebuilt) / med(in_place):.2f}")
    print(f"share of a 1 s tick spent refreshing: {med(in_place) * 100:.1f}%")


if __name__ == "__main__":
    main()
