"""Benchmark: the collective ledger of a large job.

    PYTHONPATH=tui:agents python bench/bench_ledger.py [--ranks 1024] [--entries 2000] [--repeat 5]

A synthetic job of `--ranks` ranks, each with a Flight Recorder trace of `--entries`
collectives on the default group (the size of a full default ring, TORCH_FR_BUFFER_SIZE=2000),
built from a real entry recorded from a gloo job (tests/data/fr/op/rank_0). Rank 7 recorded
a different size at one collective near the end and rank 11 is one call behind, so the
analysis has to find both.

The agent reduces each dump before sending it (`slim_trace`: per process group the
sequence ids and an index per collective into a small table of op, sizes and dtypes);
that runs on each node for its own ranks and is printed per dump. In the console:
- baseline: `json.loads` of every rank's reply (just loading the data);
- ledger: `parse_trace` per rank and `build_ledger` (positions, behind, first mismatch);
- key check: the type test of every collective's key, as it was (a generator asking
  `type(k) is not int` of each of the 2,000 keys of each rank) against what the parse does
  now (`_keys`: the list packed into bytes in C, the largest found once per distinct list),
  in the same run;
- wait-for: `build_wait_for` on that ledger (rank 11 behind: every other rank waits on
  it; rank 11 is the root, its stack taken as outside any collective).
Prints the median of `--repeat` runs and the ratios ledger / baseline, wait-for / baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.ledger import build_ledger, parse_trace  # noqa: E402
from areal_console.core.ledger.trace import TraceError, _keys  # noqa: E402
from areal_console.core.ledger.waitfor import RankActivity, build_wait_for  # noqa: E402
from areal_node.agent.flight_recorder import safe_unpickle, slim_trace  # noqa: E402

SAMPLE = ROOT / "tests" / "data" / "fr" / "op" / "rank_0"


def rank_dump(ranks: int, entries: int, last: int, odd_at: int | None) -> dict[str, Any]:
    """One rank's Flight Recorder dump (torch's layout) of `last` all_reduces."""
    real = safe_unpickle(SAMPLE.read_bytes())
    template = next(e for e in real["entries"] if e["profiling_name"].endswith("all_reduce"))
    rows = []
    for seq in range(1, last + 1):
        e = dict(template, collective_seq_id=seq, record_id=seq - 1, op_id=seq)
        if seq == odd_at:
            e["input_sizes"] = [[5]]
        rows.append(e)
    return {
        "version": real["version"],
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}},
        "pg_status": {
            "0": {"last_enqueued_collective": last, "last_completed_collective": last - 1}
        },
        "entries": rows,
    }


def agent_replies(ranks: int, entries: int) -> tuple[list[bytes], float]:
    """Every rank's trace as the JSON its agent sends: rank 7 recorded other sizes at one
    collective near the end, rank 11 is one call behind. Also the agent's time to reduce
    one dump (`slim_trace`; on a real job each node does its own ranks in parallel)."""
    dumps = {
        None: rank_dump(ranks, entries, entries, None),
        7: rank_dump(ranks, entries, entries, entries - 5),
        11: rank_dump(ranks, entries, entries - 1, None),
    }
    start = time.perf_counter()
    texts = {k: json.dumps(slim_trace(d)).encode() for k, d in dumps.items()}
    per_dump = (time.perf_counter() - start) / len(dumps)
    return [texts.get(r, texts[None]) for r in range(ranks)], per_dump


def load(replies: list[bytes]) -> list[dict[str, Any]]:
    """Baseline: decode every agent reply (just loading the data)."""
    return [json.loads(r) for r in replies]


def ledger(traces: list[dict[str, Any]]) -> Any:
    parsed = [parse_trace(r, "node", "live", "-", t) for r, t in enumerate(traces)]
    return build_ledger(parsed, world_size=len(traces))


def key_check_before(traces: list[dict[str, Any]]) -> bool:
    """The per-key type test the parse did before (it dominated a profile at 1,024 ranks)."""
    return any(any(type(k) is not int for k in g["keys"]) for t in traces for g in t["groups"])


def key_check_now(traces: list[dict[str, Any]]) -> bool:
    """The check the parse does now (`_keys`: packed as int64 in C, bounds once per list)."""
    for t in traces:
        for g in t["groups"]:
            try:
                _keys(g["keys"], len(g["table"]))
            except TraceError:
                return True
    return False


def timed(fn: Any, arg: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(arg)
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    replies, per_dump = agent_replies(args.ranks, args.entries)
    size = sum(len(r) for r in replies)
    print(f"{args.ranks} ranks x {args.entries} entries: {size / 1e6:.1f} MB from the agents; "
          f"reducing one dump on its node: {per_dump * 1000:.0f} ms")  # fmt: skip
    base, full, waits, before, now = [], [], [], [], []
    result = graph = None
    activity = {r: RankActivity(r, "collective", "all_reduce") for r in range(args.ranks)}
    activity[11] = RankActivity(11, "compute", "train_step (x.py:1)")
    for _ in range(args.repeat):
        t, traces = timed(load, replies)
        base.append(t)
        t, result = timed(ledger, traces)
        full.append(t)
        t, bad = timed(key_check_before, traces)
        before.append(t)
        assert not bad
        t, bad = timed(key_check_now, traces)
        now.append(t)
        assert not bad
        t, graph = timed(lambda lg: build_wait_for(lg, activity).to_json(), result)
        waits.append(t)
    group = result.groups[0]
    assert group.mismatch is not None and group.mismatch.seq == args.entries - 5
    assert group.behind == {11: 1}, group.behind
    b, f = statistics.median(base), statistics.median(full)
    print(f"baseline, decode the replies:      {b:.3f} s  median of {args.repeat}")
    print(f"ledger (parse + line up + verdict): {f:.3f} s  median of {args.repeat}")
    print(f"ledger incl. decoding:              {b + f:.3f} s")
    print(f"ratio ledger / baseline: {f / b:.2f}")
    kb, kn = statistics.median(before), statistics.median(now)
    print(f"key check, per key (before):        {kb:.3f} s; packed (now): {kn:.3f} s; "
          f"ratio now / before: {kn / kb:.2f}")  # fmt: skip
    w = statistics.median(waits)
    assert graph is not None and [r["rank"] for r in graph["roots"]] == [11], graph["roots"]
    print(f"wait-for graph (build + JSON):      {w:.3f} s  median of {args.repeat}, "
          f"ratio wait-for / baseline: {w / b:.3f}; root {graph['roots'][0]}")  # fmt: skip
    for line in group.findings():
        print(f"finding: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
