"""Benchmarks for stack capture and analysis.

    PYTHONPATH=tui:agents python bench/bench_stacks.py [--ranks 8] [--sizes 1024,16384,100000]

1. Analysis: synthetic jobs of 1k/4k/16k ranks built from the real py-spy dumps recorded
   in tests/data/pyspy (a cleanup deadlock: most ranks in the training loop's all_reduce,
   a few in a cleanup barrier, a few in a mismatched broadcast). Timed: building the
   capture from the agents' replies, merging and diagnosing, and the JSON export.
2. Capture: a real hung gloo job with --ranks ranks on this machine; `areal-console
   stacks`' capture (one agent, one py-spy per rank, in parallel) against the loop from
   AReaL's guide, `for pid in ...; do py-spy dump --pid $pid; done`, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.fleet import Fleet  # noqa: E402
from areal_console.core.stacks.capture import CaptureOptions, capture_raw  # noqa: E402
from areal_console.core.stacks.diagnose import diagnose  # noqa: E402
from areal_console.core.stacks.merge import analyse  # noqa: E402
from areal_console.core.stacks.records import build_capture  # noqa: E402
from areal_console.core.stacks.report import capture_json  # noqa: E402
from areal_console.core.targets.resolve import NodeSpec  # noqa: E402
from areal_node.agent.pyspy import key_stacks  # noqa: E402

from tests.support.fixtures.hang import rank_script, start_scenario  # noqa: E402

DATA = ROOT / "tests" / "data" / "pyspy"
RANKS_PER_NODE = 8


def _rank_dumps(name: str) -> list[dict[str, Any]]:
    """The recorded dumps of rank processes in fixture `name`, ordered by rank."""
    raw = json.loads((DATA / f"{name}.json").read_text())
    node = raw["nodes"][0]
    rank_of = {p["pid"]: p["rank"] for p in node["processes"]}
    dumps = [d for d in node["samples"][0] if rank_of.get(d["pid"]) is not None]
    return sorted(dumps, key=lambda d: rank_of[d["pid"]])


def synthetic_raw(world: int) -> dict[str, Any]:
    """A raw capture of `world` ranks, 8 per node, from real recorded dumps, as the
    agents send it: each node's `pyspy` reply keyed by the agent (`key_stacks`) and
    decoded on its own (no Python object shared between nodes)."""
    return decoded(_synthetic_nodes(world), node_replies(_synthetic_nodes(world)))


def decoded(raw: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    """`raw` with each node's sample replaced by its decoded reply line."""
    for node, line in zip(raw["nodes"], lines, strict=True):
        node["samples"] = [json.loads(line)["dumps"]]
    return raw


def node_replies(raw: dict[str, Any]) -> list[str]:
    """Each node's `pyspy` reply as the JSON line its agent writes."""
    return [
        json.dumps({"dumps": key_stacks(json.loads(json.dumps(n["samples"][0])))})
        for n in raw["nodes"]
    ]


def _synthetic_nodes(world: int) -> dict[str, Any]:
    deadlock = _rank_dumps("cleanup_deadlock")
    mismatch = _rank_dumps("collective_mismatch")
    training, cleanup = deadlock[0], deadlock[-1]
    broadcast = mismatch[1]
    nodes = []
    for n in range(world // RANKS_PER_NODE):
        procs, dumps = [], []
        for local in range(RANKS_PER_NODE):
            rank = n * RANKS_PER_NODE + local
            pid = 10_000 + rank
            source = training
            if rank % 997 == 5:
                source = cleanup
            elif rank % 1021 == 9:
                source = broadcast
            procs.append(
                {
                    "pid": pid,
                    "ppid": 1,
                    "rank": rank,
                    "local_rank": local,
                    "world_size": world,
                    "role": "trainer",
                    "cmdline": "python train.py",
                }
            )
            dumps.append(
                {"pid": pid, "requested_pid": pid, "ok": True, "threads": source["threads"]}
            )
        nodes.append(
            {"node": f"node{n:04d}", "error": None, "processes": procs, "samples": [dumps]}
        )
    return {"captured_at": "2026-01-01T00:00:00+00:00", "interval": 0.0, "nodes": nodes}


def best_of(fn: Any, repeat: int = 3) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def bench_analysis(sizes: list[int], repeat: int) -> None:
    print(
        f"analysis (median of {repeat}, each on a fresh capture: nothing cached from a previous "
        f"repeat; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})"
    )
    print("anchor: json.loads of the agents' replies (the decode the console does anyway)")
    print("bar: build + merge + diagnose <= 1 s at 100,000 ranks")
    print(
        f"{'ranks':>7} {'decode':>8} {'build':>8} {'merge':>8} {'diagnose':>9} {'analysis':>9} "
        f"{'(cpu)':>7} {'(best)':>7} {'/decode':>8} {'json':>8}  result"
    )
    for world in sizes:
        base = _synthetic_nodes(world)
        lines = node_replies(base)
        raw = decoded(base, lines)
        rows: dict[str, list[float]] = {k: [] for k in ("decode", "build", "merge", "diag", "cpu")}
        analysis = diagnosis = None
        for _ in range(repeat):
            analysis = diagnosis = None  # the previous repeat's records are freed first
            t0 = time.perf_counter()
            [json.loads(line) for line in lines]
            rows["decode"].append(time.perf_counter() - t0)
            c0, t0 = time.process_time(), time.perf_counter()
            capture = build_capture(raw)
            t1 = time.perf_counter()
            analysis = analyse(capture)
            t2 = time.perf_counter()
            diagnosis = diagnose(analysis)
            t3 = time.perf_counter()
            rows["cpu"].append(time.process_time() - c0)
            rows["build"].append(t1 - t0)
            rows["merge"].append(t2 - t1)
            rows["diag"].append(t3 - t2)
        assert analysis is not None and diagnosis is not None
        totals = [
            b + m + d for b, m, d in zip(rows["build"], rows["merge"], rows["diag"], strict=True)
        ]
        med = {k: statistics.median(v) for k, v in rows.items()}
        total = statistics.median(totals)
        t_json, _ = best_of(
            lambda c=analysis.capture, a=analysis, d=diagnosis: capture_json(c, a, d)
        )
        labels = ", ".join(f"{g.label[:24]}({g.size})" for g in analysis.groups)
        print(
            f"{world:>7} {med['decode']:>7.3f}s {med['build']:>7.3f}s {med['merge']:>7.3f}s "
            f"{med['diag']:>8.3f}s {total:>8.3f}s {med['cpu']:>6.3f}s {min(totals):>6.3f}s "
            f"{total / med['decode']:>7.2f}x {t_json:>7.3f}s  {diagnosis.pattern}: {labels}"
        )


def bench_screen(world: int) -> None:
    """Seconds from pushing the Stacks screen to its groups and tree being shown."""
    import asyncio

    from areal_console.screens.stacks import StacksScreen
    from areal_console.widgets.rank_group_table import RankGroupTable
    from textual.app import App

    capture = build_capture(synthetic_raw(world))
    screen = StacksScreen(capture)

    class Bench(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen)

    async def run() -> float:
        async with Bench().run_test(size=(160, 50)) as pilot:
            t0 = time.perf_counter()
            while not (screen.analysis and screen.query_one(RankGroupTable).shown):
                await pilot.pause(0.005)
            await pilot.pause()
            return time.perf_counter() - t0

    print(
        f"\nStacks screen with {world} ranks: groups and tree shown "
        f"{asyncio.run(run()):.3f}s after mount"
    )


def bench_capture(nproc: int, repeat: int) -> None:
    print(
        f"\ncapture of a hung {nproc}-rank gloo job on this machine (median of {repeat}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})"
    )
    with start_scenario("collective_mismatch", nproc=nproc) as job:
        job.wait_ready(300)
        pids = job.rank_pids()
        loop = "for pid in " + " ".join(map(str, pids)) + "; do py-spy dump --pid $pid; done"
        fleet = Fleet([NodeSpec(name="node0")])
        try:
            session = fleet.sessions[0]
            session.connect()  # agent up: measure the capture, not the agent start
            options = CaptureOptions(match=str(job.state_dir))
            seq, dumps_only, full, cpu = [], [], [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                out = subprocess.run(["bash", "-c", loop], capture_output=True, text=True)
                seq.append(time.perf_counter() - t0)
                assert out.stdout.count("Thread ") >= nproc, out.stderr
                t0 = time.perf_counter()
                reply = session.call("pyspy", {"pids": pids})
                dumps_only.append(time.perf_counter() - t0)
                assert all(d["ok"] for d in reply["dumps"])
                cpu.append(sum(d["seconds"] for d in reply["dumps"]))
                t0 = time.perf_counter()
                raw = capture_raw(fleet, options)
                full.append(time.perf_counter() - t0)
                dumps = raw["nodes"][0]["samples"][0]
                assert sum(1 for d in dumps if d["ok"]) == nproc  # the ranks (no launcher)
        finally:
            fleet.close()
    s, d, f = statistics.median(seq), statistics.median(dumps_only), statistics.median(full)
    print(f"  sequential loop, {nproc} x py-spy dump:              {s:.3f}s")
    print(
        f"  agent pyspy op, {nproc} dumps in parallel:           {d:.3f}s  "
        f"({s / d:.1f}x; sum of per-dump wall times {statistics.median(cpu):.3f}s)"
    )
    print(f"  full capture (find ranks + launcher, dump, build): {f:.3f}s  ({s / f:.1f}x)")


def bench_cluster_capture(nodes: int, ranks_per_node: int, repeat: int) -> None:
    """32 ranks on the sshd test cluster: the loop on each node in turn vs one capture."""
    import uuid

    from tests.support.cluster import TestCluster, skip_reason

    reason = skip_reason()
    if reason:
        print(f"\ncluster capture skipped: {reason}")
        return
    import tempfile

    world = nodes * ranks_per_node
    marker = f"bench-stacks-{uuid.uuid4().hex[:8]}"
    print(
        f"\ncapture of a hung {world}-rank gloo job on {nodes} sshd nodes "
        f"(median of {repeat}; {os.cpu_count()} CPUs shared by all nodes)"
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-stacks-") as tmp,
        TestCluster(tmp, nodes=nodes) as cluster,
    ):
        script = rank_script("cleanup_deadlock", marker, str(ROOT))
        t0 = time.perf_counter()
        with cluster.start_gloo_job(ranks_per_node=ranks_per_node, script=script, timeout=900):
            print(f"  job up in {time.perf_counter() - t0:.0f}s")
            fleet = Fleet(cluster.specs(), **cluster.ssh_options())
            try:
                fleet.connect_all()
                options = CaptureOptions(match=marker)
                raw = capture_raw(fleet, options)
                pids = {n["node"]: [p["pid"] for p in n["processes"]] for n in raw["nodes"]}
                assert sum(map(len, pids.values())) == world, pids
                seq, on_nodes, full = [], [], []
                for _ in range(repeat):
                    # AReaL's loop, typed on each node in turn (one ssh per node); the
                    # node also reports how long the loop itself took, without SSH.
                    t0 = time.perf_counter()
                    inside = 0.0
                    for node in cluster.nodes:
                        loop = (
                            "for pid in "
                            + " ".join(map(str, pids[node.name]))
                            + "; do py-spy dump --pid $pid; done"
                        )
                        timed = (
                            f"s=$(date +%s%N); n=$( ({loop}) | grep -c 'Thread '); "
                            "e=$(date +%s%N); echo $n $((e-s))"
                        )
                        out = node.run(timed, timeout=300)
                        threads, ns = out.stdout.split()
                        assert int(threads) >= ranks_per_node, out.stderr
                        inside += int(ns) / 1e9
                    seq.append(time.perf_counter() - t0)
                    on_nodes.append(inside)
                    t0 = time.perf_counter()
                    raw = capture_raw(fleet, options)
                    full.append(time.perf_counter() - t0)
                    ok = sum(1 for n in raw["nodes"] for d in n["samples"][0] if d["ok"])
                    assert ok == world, raw
                capture = build_capture(raw)
                diagnosis = diagnose(analyse(capture))
            finally:
                fleet.close()
    s, f = statistics.median(seq), statistics.median(full)
    n = statistics.median(on_nodes)
    print(f"  sequential: ssh + the loop on node1..node{nodes} in turn: {s:.3f}s ({s / f:.1f}x)")
    print(f"  ... of which the loops themselves (no ssh):        {n:.3f}s ({n / f:.1f}x)")
    print(f"  areal-console capture, all nodes at once:          {f:.3f}s")
    print(
        f"  diagnosis: {diagnosis.pattern}; groups: "
        + ", ".join(f"{g.label}({g.size})" for g in analyse(capture).groups)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,16384,100000")
    parser.add_argument("--ranks", type=int, default=8, help="ranks of the live job")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-capture", action="store_true")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also capture across the sshd test cluster (root, openssh-server)",
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    args = parser.parse_args()
    bench_analysis([int(s) for s in args.sizes.split(",")], args.repeat)
    bench_screen(4096)
    if not args.skip_capture:
        bench_capture(args.ranks, args.repeat)
    if args.cluster:
        bench_cluster_capture(args.nodes, args.ranks_per_node, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
