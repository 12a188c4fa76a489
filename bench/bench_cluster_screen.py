"""Cluster screen CPU per 1 Hz tick at 128 to 512 nodes x 8 GPUs x 8 ranks, against the
screen of an earlier commit (the baseline) and a bare DataTable, in the same run.

    python bench/bench_cluster_screen.py [--nodes 128,512] [--sizes 160x50,80x24]
        [--ticks 10] [--rounds 3] [--baseline 65998b9]

Each tick changes every GPU's utilisation and every rank's CPU% (the worst case of a 1 Hz
sample). Measured: the process CPU time (`time.process_time`) of a tick, from the new
sample to the screen drawn, in a headless Textual app; then of one key (`j`, the process
cursor down) handled and drawn. The new sample itself (what the monitor's thread does
when it arrives) and a garbage collection after it are outside the measurement.

- now: this tree's Cluster screen (`refresh_view()` from the monitor's views);
- baseline: the same measurement run on `--baseline` (a commit; `git archive` of its
  `tui/` and `agents/` into a temporary folder, imported from there in a subprocess: the
  subprocess prints the path it imported the screen from);
- anchor: a bare app with two `DataTable`s holding every row, where each tick calls
  `update_cell` exactly for the cells that changed, values computed by the benchmark
  for free: the least a table that keeps every row current can do.

Rounds alternate baseline and now; ratios are medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "cluster_recording.json"
BASELINE = "65998b9"  # the commit before the Cluster screen updated only the rows in view


def synthetic_cluster(nodes: int) -> list[Any]:
    """`nodes` copies of a recorded 8-GPU node, with 8 ranks each and distinct pids/ranks."""
    from areal_console.core.connection.monitor import NodeView

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


def tick(views: list[Any], t: int) -> None:
    """A new sample of every node: every GPU's utilisation and every rank's CPU% moved."""
    for i, v in enumerate(views):
        for g in v.sample["gpus"]:
            g["util"] = (t * 7 + i + g["index"]) % 100
        for p in v.sample["processes"]:
            p["cpu_percent"] = float((t * 3 + p["rank"]) % 100)
        v.take_sample(v.sample)  # what the monitor does with each new sample
    gc.collect()  # the sample's garbage is the monitor's, not the screen's


async def settle(pilot: Any) -> None:
    """Let the app process what is queued and draw it."""
    await pilot.pause()
    await pilot.pause()


async def screen_round(nodes: int, size: tuple[int, int], ticks: int, start: int) -> dict[str, Any]:
    """CPU ms per tick and per key of the Cluster screen of whichever tree is imported."""
    import areal_console.screens.cluster as cluster
    from areal_console.app import ConsoleApp
    from areal_console.core.connection.monitor import RecordedMonitor
    from areal_console.widgets.process_table import ProcessTable

    views = synthetic_cluster(nodes)
    app = ConsoleApp(None, RecordedMonitor(views), refresh_interval=3600)
    t0 = time.process_time()
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert isinstance(screen, cluster.ClusterScreen)
        await settle(pilot)
        opened = time.process_time() - t0
        procs = screen.query_one(ProcessTable)
        procs.focus()
        screen.refresh_view()
        await settle(pilot)
        tick_cpu, key_cpu = [], []
        for t in range(ticks):
            tick(views, start + t)
            t0 = time.process_time()
            screen.refresh_view()
            await settle(pilot)
            tick_cpu.append(time.process_time() - t0)
            t0 = time.process_time()
            await pilot.press("j")
            await settle(pilot)
            key_cpu.append(time.process_time() - t0)
        assert procs.row_count == nodes * 8, procs.row_count
        assert procs.cursor_row == ticks, procs.cursor_row  # every key was handled
    return {
        "tick_ms": statistics.median(tick_cpu) * 1000,
        "key_ms": statistics.median(key_cpu) * 1000,
        "open_ms": opened * 1000,
        "module": cluster.__file__,
    }


def anchor_app(views: list[Any]) -> Any:
    """Two plain DataTables with the Cluster screen's rows, laid out like the screen (the
    node list at most 12 lines, the processes in the rest)."""
    from areal_console.widgets.node_table import COLUMNS as NODE_COLUMNS
    from areal_console.widgets.node_table import node_cells
    from areal_console.widgets.process_table import COLUMNS as PROCESS_COLUMNS
    from areal_console.widgets.process_table import process_cells, row_key
    from textual.app import App, ComposeResult
    from textual.widgets import DataTable

    process_columns = [(k, label) for k, label in PROCESS_COLUMNS if k != "job"]

    class BareTables(App[None]):
        CSS = """
        #nodes { height: auto; max-height: 12; }
        #procs { height: 1fr; }
        """

        def compose(self) -> ComposeResult:
            yield DataTable(id="nodes")
            yield DataTable(id="procs")

        def on_mount(self) -> None:
            nodes = self.query_one("#nodes", DataTable)
            procs = self.query_one("#procs", DataTable)
            for key, label in NODE_COLUMNS:
                nodes.add_column(label, key=key)
            for key, label in process_columns:
                procs.add_column(label, key=key)
            for v in views:
                cells = node_cells(v)
                nodes.add_row(*(cells[k] for k, _ in NODE_COLUMNS), key=v.name)
                for p in v.processes:
                    cells = process_cells(v.name, p)
                    procs.add_row(*(cells[k] for k, _ in process_columns),
                                  key=row_key(v.name, p.pid))  # fmt: skip

        def update(self) -> None:
            """Exactly the cells a tick changes, values computed directly."""
            nodes = self.query_one("#nodes", DataTable)
            procs = self.query_one("#procs", DataTable)
            with self.batch_update():
                for v in views:
                    utils = [g.util or 0 for g in v.gpus]
                    nodes.update_cell(v.name, "util", f"{sum(utils) / len(utils):.0f}%")
                    for p in v.processes:
                        procs.update_cell(row_key(v.name, p.pid), "cpu",
                                          f"{p.cpu_percent or 0:.0f}")  # fmt: skip

    return BareTables()


async def anchor_round(nodes: int, size: tuple[int, int], ticks: int, start: int) -> float:
    views = synthetic_cluster(nodes)
    app = anchor_app(views)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        app.update()
        await settle(pilot)
        cpu = []
        for t in range(ticks):
            tick(views, start + t)
            t0 = time.process_time()
            app.update()
            await settle(pilot)
            cpu.append(time.process_time() - t0)
    return statistics.median(cpu) * 1000


def baseline_tree(rev: str, into: Path) -> Path:
    """`tui/` and `agents/` of commit `rev`, unpacked under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "tui", "agents"],
        check=True,
        capture_output=True,
    ).stdout
    tar = into / "tree.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def run_worker(tree: Path, nodes: int, size: str, ticks: int, start: int) -> dict[str, Any]:
    """One screen round in a subprocess importing the console from `tree`."""
    env = dict(os.environ, PYTHONPATH=f"{tree / 'tui'}{os.pathsep}{tree / 'agents'}")
    command = [sys.executable, __file__, "--worker", "--nodes", str(nodes), "--sizes", size,
               "--ticks", str(ticks), "--start", str(start)]  # fmt: skip
    out = subprocess.run(
        command,
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="128,512")
    parser.add_argument("--sizes", default="160x50,80x24")
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="commit to compare with")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = asyncio.run(
            screen_round(int(args.nodes), parse_size(args.sizes), args.ticks, args.start)
        )
        print(json.dumps(result))
        return

    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        old = baseline_tree(args.baseline, Path(tmp))
        print(f"baseline: commit {args.baseline}; now: this tree ({ROOT}); {args.ticks} ticks x "
              f"{args.rounds} rounds, CPU ms, median of rounds (load {os.getloadavg()[0]:.1f})")  # fmt: skip
        print("| nodes | ranks | terminal | anchor tick | baseline tick | now tick | now / "
              "baseline | baseline key | now key | baseline open | now open |")  # fmt: skip
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for nodes in (int(n) for n in args.nodes.split(",")):
            for size in args.sizes.split(","):
                runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "now": []}
                anchors = []
                for r in range(args.rounds):
                    start = r * args.ticks
                    runs["baseline"].append(run_worker(old, nodes, size, args.ticks, start))
                    runs["now"].append(run_worker(ROOT, nodes, size, args.ticks, start))
                    anchors.append(
                        asyncio.run(anchor_round(nodes, parse_size(size), args.ticks, start))
                    )
                assert all(str(old) in run["module"] for run in runs["baseline"])
                assert all(str(old) not in run["module"] for run in runs["now"])
                b, n = runs["baseline"], runs["now"]
                ratio = med(x["tick_ms"] / y["tick_ms"] for x, y in zip(n, b, strict=True))
                print(
                    f"| {nodes} | {nodes * 8:,} | {size} | {med(anchors):.1f} | "
                    f"{med(x['tick_ms'] for x in b):.1f} | {med(x['tick_ms'] for x in n):.1f} | "
                    f"{ratio:.2f}x | {med(x['key_ms'] for x in b):.1f} | "
                    f"{med(x['key_ms'] for x in n):.1f} | {med(x['open_ms'] for x in b):.0f} | "
                    f"{med(x['open_ms'] for x in n):.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
