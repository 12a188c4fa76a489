"""Cluster screen CPU at 128 nodes x 8 GPUs x 8 ranks at 1 Hz, against a bare DataTable.

    python bench/bench_cluster_screen.py [--nodes 128] [--ticks 10] [--rounds 5]

Each tick changes every GPU's utilisation and every rank's CPU% (the worst case of a 1 Hz
sample). Measured: the process CPU time (`time.process_time`) of a tick, from the new
sample to the screen drawn, in a headless Textual app of 160x50.

- console: the Cluster screen's `refresh_view()` from the monitor's views (node list,
  process pane, GPU pane of the selected node, status line);
- anchor: a bare app with two `DataTable`s holding the same rows and cells, where each
  tick calls `update_cell` exactly for the cells that changed (the node's utilisation, the
  rank's CPU%), computed by the benchmark for free -- the least any view can do;
- rebuild: the Cluster screen clearing and refilling its tables (a view without keys).

Rounds alternate console and anchor; the ratio is the median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.app import ConsoleApp  # noqa: E402
from areal_console.core.connection.monitor import NodeView, RecordedMonitor  # noqa: E402
from areal_console.screens.cluster import ClusterScreen  # noqa: E402
from areal_console.widgets.node_table import COLUMNS as NODE_COLUMNS  # noqa: E402
from areal_console.widgets.node_table import NodeTable, node_cells  # noqa: E402
from areal_console.widgets.process_table import COLUMNS as PROCESS_COLUMNS  # noqa: E402
from areal_console.widgets.process_table import (  # noqa: E402
    ProcessTable,
    process_cells,
    row_key,
)
from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets import DataTable  # noqa: E402

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
        v.take_sample(v.sample)  # what the monitor does with each new sample


async def settle(pilot: Any) -> None:
    """Let the app process the tick and draw it."""
    await pilot.pause()
    await pilot.pause()


async def console_round(nodes: int, ticks: int, start: int) -> tuple[float, float]:
    """(CPU seconds per tick refreshing in place, per tick rebuilding)."""
    views = synthetic_cluster(nodes)
    app = ConsoleApp(None, RecordedMonitor(views), refresh_interval=3600)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        await settle(pilot)
        screen.action_back()
        procs = screen.query_one(ProcessTable)
        node_table = screen.query_one(NodeTable)
        screen.refresh_view()
        await settle(pilot)
        t0 = time.process_time()
        for t in range(ticks):
            tick(views, start + t)
            screen.refresh_view()
            await settle(pilot)
        in_place = (time.process_time() - t0) / ticks
        assert procs.row_count == nodes * 8, procs.row_count
        t0 = time.process_time()
        for t in range(ticks):
            tick(views, start + ticks + t)
            procs.clear()
            node_table.clear()
            screen.refresh_view()
            await settle(pilot)
        rebuilt = (time.process_time() - t0) / ticks
    return in_place, rebuilt


class BareTables(App[None]):
    """Two plain DataTables with the Cluster screen's rows: the anchor. Laid out like the
    screen (the node list at most 14 lines, the processes in the rest), so that as many
    rows of each are drawn."""

    CSS = """
    #nodes { height: auto; max-height: 14; }
    #procs { height: 1fr; }
    """

    def __init__(self, views: list[NodeView]) -> None:
        super().__init__()
        self.views = views

    def compose(self) -> ComposeResult:
        yield DataTable(id="nodes")
        yield DataTable(id="procs")

    def on_mount(self) -> None:
        nodes = self.query_one("#nodes", DataTable)
        procs = self.query_one("#procs", DataTable)
        for key, label in NODE_COLUMNS:
            nodes.add_column(label, key=key)
        for key, label in PROCESS_COLUMNS:
            procs.add_column(label, key=key)
        for v in self.views:
            cells = node_cells(v)
            nodes.add_row(*(cells[k] for k, _ in NODE_COLUMNS), key=v.name)
            for p in v.processes:
                cells = process_cells(v.name, p)
                procs.add_row(*(cells[k] for k, _ in PROCESS_COLUMNS), key=row_key(v.name, p.pid))

    def update(self) -> None:
        """Exactly the cells a tick changes, values computed directly."""
        nodes = self.query_one("#nodes", DataTable)
        procs = self.query_one("#procs", DataTable)
        with self.batch_update():
            for v in self.views:
                utils = [g.util or 0 for g in v.gpus]
                nodes.update_cell(v.name, "util", f"{sum(utils) / len(utils):.0f}%")
                for p in v.processes:
                    procs.update_cell(row_key(v.name, p.pid), "cpu", f"{p.cpu_percent or 0:.0f}")


async def anchor_round(nodes: int, ticks: int, start: int) -> float:
    views = synthetic_cluster(nodes)
    app = BareTables(views)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        app.update()
        await settle(pilot)
        t0 = time.process_time()
        for t in range(ticks):
            tick(views, start + t)
            app.update()
            await settle(pilot)
        return (time.process_time() - t0) / ticks


async def measure(nodes: int, ticks: int, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"console": [], "anchor": [], "rebuild": [], "ratio": []}
    for r in range(rounds):
        in_place, rebuilt = await console_round(nodes, ticks, r * 3 * ticks)
        anchor = await anchor_round(nodes, ticks, r * 3 * ticks)
        out["console"].append(in_place)
        out["anchor"].append(anchor)
        out["rebuild"].append(rebuilt)
        out["ratio"].append(in_place / anchor)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    m = asyncio.run(measure(args.nodes, args.ticks, args.rounds))
    med = statistics.median
    print(
        f"{args.nodes} nodes x 8 GPUs, {args.nodes * 8} rank rows, {args.ticks} ticks x "
        f"{args.rounds} rounds; CPU per tick, median of rounds (load {os.getloadavg()[0]:.1f})"
    )
    print(f"  bare DataTable, changed cells only (anchor): {med(m['anchor']) * 1000:7.1f} ms")
    print(f"  Cluster screen refresh in place:             {med(m['console']) * 1000:7.1f} ms")
    print(f"  Cluster screen rebuilding its tables:        {med(m['rebuild']) * 1000:7.1f} ms")
    print(
        f"  console / anchor: {med(m['ratio']):.2f}x  (per round: "
        + ", ".join(f"{x:.2f}" for x in m["ratio"])
        + ")  bar: 1.05x"
    )


if __name__ == "__main__":
    main()
