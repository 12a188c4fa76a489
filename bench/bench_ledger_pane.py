"""Benchmark: the Stacks screen's ledger pane opening on a 4,096-rank job.

    python bench/bench_ledger_pane.py [--ranks 4096] [--tp 8] [--entries 200] [--repeat 3]

Two synthetic jobs of `--ranks` ranks, every trace entry copied from a real one recorded
from a gloo job (tests/data/fr/op/rank_0, as bench/bench_ledger.py builds them):
- one group: the default group only, rank 7 with other sizes at one collective, rank 11
  one call behind (bench_ledger.py's job, `--entries` collectives);
- tensor x data parallel: besides the default group, each rank in a tensor-parallel group
  of `--tp` ranks and a data-parallel group of ranks / tp, all_reduces alternating in
  both (ranks / tp + tp + 1 groups: 521 at 4,096 ranks), rank 11 one call behind in its
  groups.

Measured (process CPU, median of `--repeat`): the ledger from the decoded traces
(`build_ledger`, as the capture does it off the UI thread), the pane's text
(`ledger_text`), and the pane shown and drawn in a headless Textual app of 160x45
(`LedgerPane.show` to the frame on screen); the lines of the pane's text and how many the
pane rendered (its `render_line` calls) against the lines it has room for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ledger
from areal_console.core.ledger import build_ledger, parse_trace
from areal_console.core.ledger.waitfor import RankActivity, build_wait_for
from areal_console.widgets import ledger_pane
from areal_console.widgets.ledger_pane import LedgerPane, ledger_text
from areal_node.agent.flight_recorder import safe_unpickle, slim_trace
from textual.app import App, ComposeResult


def tp_dp_dump(rank: int, ranks: int, tp: int, entries: int, behind: bool) -> dict[str, Any]:
    """One rank's Flight Recorder dump with a default, a tensor- and a data-parallel group,
    `entries` all_reduces alternating between tp and dp (one fewer when `behind`)."""
    real = safe_unpickle(bench_ledger.SAMPLE.read_bytes())
    template = next(e for e in real["entries"] if e["profiling_name"].endswith("all_reduce"))
    tp_index, dp_index = rank // tp, rank % tp
    tp_ranks = list(range(tp_index * tp, tp_index * tp + tp))
    dp_ranks = list(range(dp_index, ranks, tp))
    groups = {
        "0": ("default_pg", list(range(ranks))),
        str(1 + tp_index): (f"tp{tp_index}", tp_ranks),
        str(1 + ranks // tp + dp_index): (f"dp{dp_index}", dp_ranks),
    }
    names = [name for name in groups if name != "0"]
    last = entries - (1 if behind else 0)
    rows, seqs = [], dict.fromkeys(names, 0)
    for i in range(last):
        name = names[i % 2]
        seqs[name] += 1
        rows.append(dict(template, collective_seq_id=seqs[name], record_id=i, op_id=i + 1,
                         pg_id=int(name), process_group=(name, groups[name][0])))  # fmt: skip
    return {
        "version": real["version"],
        "pg_config": {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in groups.items()},
        "pg_status": {n: status(seqs.get(n, 0)) for n in groups},
        "entries": rows,
    }


def status(last: int) -> dict[str, int]:
    return {"last_enqueued_collective": last, "last_completed_collective": max(0, last - 1)}


def tp_dp_traces(ranks: int, tp: int, entries: int) -> list[dict[str, Any]]:
    """Every rank's slimmed trace, decoded (as the console holds them)."""
    return [
        json.loads(json.dumps(slim_trace(tp_dp_dump(r, ranks, tp, entries, behind=r == 11))))
        for r in range(ranks)
    ]


def one_group_traces(ranks: int, entries: int) -> list[dict[str, Any]]:
    replies, _ = bench_ledger.agent_replies(ranks, entries)
    return bench_ledger.load(replies)


def the_ledger(traces: list[dict[str, Any]]) -> Any:
    parsed = [parse_trace(r, f"n{r // 8:03d}", "live", "-", t) for r, t in enumerate(traces)]
    return build_ledger(parsed, world_size=len(traces))


class PaneApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LedgerPane(id="ledger")


async def open_pane(ledger: Any, graph: Any) -> tuple[float, int, int]:
    """(CPU seconds from `show` to the pane drawn, lines rendered, lines of room)."""
    app = PaneApp()
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        pane = app.query_one(LedgerPane)
        rendered = [0]
        real = pane.render_line

        def counted(y: int) -> Any:
            rendered[0] += 1
            return real(y)

        pane.render_line = counted  # type: ignore[method-assign]
        start = time.process_time()
        pane.show(ledger, graph)
        await pilot.pause()
        await pilot.pause()
        cpu = time.process_time() - start
        return cpu, rendered[0], pane.content_region.height


def measure(label: str, traces: list[dict[str, Any]], behind: int, repeat: int) -> None:
    ranks = len(traces)
    activity = {r: RankActivity(r, "collective", "all_reduce") for r in range(ranks)}
    activity[behind] = RankActivity(behind, "compute", "train_step (x.py:1)")
    builds, texts, opens = [], [], []
    ledger = graph = None
    lines = rendered = room = 0
    for _ in range(repeat):
        start = time.process_time()
        ledger = the_ledger(traces)
        builds.append(time.process_time() - start)
        graph = build_wait_for(ledger, activity)
        start = time.process_time()
        text = ledger_text(ledger, graph)
        texts.append(time.process_time() - start)
        lines = len(text.plain.splitlines())
        cpu, rendered, room = asyncio.run(open_pane(ledger, graph))
        opens.append(cpu)
    assert ledger is not None
    med = statistics.median
    print(f"{label}: {ranks:,} ranks, {len(ledger.groups)} groups; ledger {med(builds):.3f} s, "
          f"pane text {med(texts) * 1000:.1f} ms ({lines} lines), pane shown and drawn "
          f"{med(opens) * 1000:.1f} ms ({rendered} line renders for {room} lines of room)")  # fmt: skip


def every_group(label: str, traces: list[dict[str, Any]], behind: int, repeat: int) -> None:
    """The baseline, in the same run: every group one a line, as the pane listed them
    before it folded groups without findings."""
    folded = ledger_pane.LISTED
    ledger_pane.LISTED = 10**9
    try:
        measure(f"{label}, every group listed (before)", traces, behind, repeat)
    finally:
        ledger_pane.LISTED = folded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    measure("one group", one_group_traces(args.ranks, args.entries), 11, args.repeat)
    traces = tp_dp_traces(args.ranks, args.tp, args.entries)
    every_group("tp x dp", traces, 11, args.repeat)
    measure("tp x dp", traces, 11, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
