"""Training-health metrics: parsing AReaL's stats log, and the cost of following a live one.

    python bench/bench_metrics.py parse  [--steps 100000] [--repeats 5] [--metrics 9,83,135]
                                         [--searching] [--report]
    python bench/bench_metrics.py follow [--seconds 30] [--step-interval 1] [--poll 2]

`parse`: a log of `--steps` steps in AReaL's format (every table made by the real
`tabulate` through tests/support/areal_logfmt.py, a cited transcription of AReaL's StatsLogger),
for each table width of `--metrics`: 9 is the reference trainer's table, 83 an AReaL PPO
actor's (tests/support/areal_logfmt.py:actor_stats); a wider one adds the actor's other keys
(`wide_stats`), as a real AReaL table reaches about 135. It times, in the same run, a plain read of the file in 4 MiB chunks (the baseline) and the
console's parser fed the same chunks (as `metrics` and the Health screen feed it); median
of `--repeats`, wall and CPU time, ratio parse / plain read. `--searching` also times the
parser with its bulk path off (every record searched and split, the parser before the bulk
path), once per log. `--report` also times the health report on the parsed run (every
check judged at every step, as `metrics` and the Health screen build it), median of
`--repeats`, as a ratio to the plain read.

`follow`: a writer appends one AReaL step (83 metrics) every `--step-interval` seconds to a
log that already holds 2,000 steps. The console follows it as the Health screen does
(every `--poll` seconds: `file_tail` through a real agent, parse, report; summaries and
plot series only when a step arrived). Measured: the agent process's CPU (node side, from
/proc) and the polling thread's CPU (console side, thread time), as % of one core; baseline
in the same run: re-reading and re-parsing the whole file every poll.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.client import AgentClient  # noqa: E402
from areal_console.core.connection.transport import LocalChannel  # noqa: E402
from areal_console.core.metrics.follow import MetricsFollower, NodeFiles  # noqa: E402
from areal_console.core.metrics.logparse import LogParser  # noqa: E402
from areal_console.core.metrics.report import summarize  # noqa: E402
from areal_node.trainer.areal_log import AREAL_NAMES  # noqa: E402

from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, tabulate_stats  # noqa: E402

CHUNK = 4 << 20
TCK = os.sysconf("SC_CLK_TCK")


def trainer_stats(step: int) -> dict[str, float]:
    full = actor_stats(step)
    stats = {name: full.get(name, 0.5 + step * 1e-4) for name in AREAL_NAMES.values()}
    stats["rollout/reward"] = full["rollout/reward"]
    stats["timeperf/train_step"] = full["timeperf/train_step"]
    return stats


# More keys AReaL's PPO actor logs (areal/trainer/ppo/actor.py:670-740, :1242-1275 at
# cbff54d6), beyond those of tests/support/areal_logfmt.py:actor_stats.
MORE_STATS = [
    f"ppo_actor/update/{name}/{agg}"
    for name in ("rkl_loss", "clipped_new_logp", "clipped_old_logp", "vocab_min_logits",
                 "vocab_max_logits")
    for agg in ("avg", "min", "max")
] + [f"ppo_actor/update/{name}" for name in ("n_valid_tokens_in_loss", "n_masked_tokens",
                                              "masked_token_ratio", "rs_filtered_fraction")] + [
    f"ppo_actor/update/version_stats/{name}"
    for name in ("sample_staleness_proximal_avg", "sample_staleness_proximal_max",
                 "sample_staleness_proximal_min", "sample_staleness_theta_avg",
                 "sample_staleness_theta_max", "sample_staleness_theta_min", "v_theta",
                 "v_proximal", "n_valid_generated_tokens")
]  # fmt: skip


def wide_stats(metrics: int):  # type: ignore[no-untyped-def]
    """Stats of `metrics` keys: the PPO actor's 83, then MORE_STATS, then (past those)
    per-stage `timeperf/...` keys of the same shape, values varying by step."""
    extra = [*MORE_STATS, *(f"timeperf/stage_{i:02d}/update_weights" for i in range(metrics))]

    def stats(step: int) -> dict[str, float]:
        full = actor_stats(step)
        names = [*full, *extra][:metrics]
        return {
            n: full.get(n, (i % 7 - 3) * 1.5 ** (i % 11) + step * 1e-3) for i, n in enumerate(names)
        }

    return stats


def stats_for(metrics: int):  # type: ignore[no-untyped-def]
    return trainer_stats if metrics == len(trainer_stats(0)) else wide_stats(metrics)


def write_log(path: Path, steps: int, stats, pool: int = 64) -> None:  # type: ignore[no-untyped-def]
    """`steps` steps as AReaL writes them: headers formatted per step, tables from a pool of
    `pool` distinct real tables (tabulate takes ~1 ms a table; 100,000 would take minutes)."""
    writer = AReaLLogWriter(path.parent / "gen", mode="spmd")
    fmt = writer.streams[0][1]
    writer.release()
    tables = [tabulate_stats(stats(i)) for i in range(pool)]
    import logging

    def line(message: str, when: float) -> str:
        record = logging.LogRecord("StatsLogger", logging.INFO, __file__, 0, message, None, None)
        record.created, record.msecs = when, (when - int(when)) * 1000
        return fmt.format(record) + "\n"

    with open(path, "w") as fh:
        t0 = 1_700_000_000.0
        for s in range(steps):
            when = t0 + 30 * s
            fh.write(line(f"Epoch 1/1 Step {s + 1}/{steps} Train step {s + 1}/{steps} done.", when))
            fh.write(line("Stats (1/1):", when))
            fh.write(line("\n" + tables[s % pool], when))


def plain_read(path: Path) -> tuple[float, float]:
    """Wall and CPU seconds to read the file in CHUNK pieces."""
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as fh:
        while fh.read(CHUNK):
            pass
    return time.perf_counter() - t0, time.process_time() - c0


def parse(path: Path, bulk: bool = True) -> tuple[float, float, LogParser]:
    """Wall and CPU seconds to parse the file fed in CHUNK pieces, and the parser."""
    t0, c0 = time.perf_counter(), time.process_time()
    parser = LogParser(bulk=bulk)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            parser.feed(chunk)
    return time.perf_counter() - t0, time.process_time() - c0, parser


def time_report(parser: LogParser) -> tuple[float, float, int]:
    """Wall and CPU seconds to build the health report of a parsed run, and its warnings."""
    from areal_console.core.metrics.report import build_report

    t0, c0 = time.perf_counter(), time.process_time()
    report = build_report("bench", parser.store, True, time.time())
    return time.perf_counter() - t0, time.process_time() - c0, len(report.warnings)


def bench_parse(
    steps: int, repeats: int, widths: list[int], searching: bool, report: bool = False
) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        for metrics in widths:
            stats = stats_for(metrics)
            label = (
                f"{'reference trainer' if stats is trainer_stats else 'AReaL'}, {metrics} metrics"
            )
            assert len(stats(0)) == metrics, len(stats(0))
            path = Path(tmp) / "trainer.log"
            write_log(path, steps, stats)
            size = path.stat().st_size
            reads, parses = [], []
            for _ in range(repeats):
                reads.append(plain_read(path))
                wall, cpu, parser = parse(path)
                assert len(parser.store.steps) == steps, (len(parser.store.steps), steps)
                parses.append((wall, cpu))
            r, rc = (statistics.median(x) for x in zip(*reads, strict=True))
            p, pc = (statistics.median(x) for x in zip(*parses, strict=True))
            print(f"{label}: {steps} steps, {size / 2**20:.0f} MiB, median of {repeats}")
            print(f"  plain read {r:.3f} s (CPU {rc:.3f} s, {size / 2**20 / r:.0f} MiB/s)")
            print(f"  parse      {p:.3f} s (CPU {pc:.3f} s, {steps / p:,.0f} steps/s, "
                  f"{p / steps * 1e6:.2f} us/step; {parser.bulk_steps} steps read in bulk)")  # fmt: skip
            print(f"  ratio parse / plain read: {p / r:.1f} (CPU {pc / rc:.1f})")
            print(f"  goal <= 1 s for {steps} steps: {'met' if p <= 1.0 else 'NOT met'}")
            if report:
                timed = [time_report(parser) for _ in range(repeats)]
                rw = statistics.median(t[0] for t in timed)
                rcpu = statistics.median(t[1] for t in timed)
                print(f"  health report {rw:.3f} s (CPU {rcpu:.3f} s, {timed[0][2]} warnings), "
                      f"ratio report / plain read: {rw / r:.2f}")  # fmt: skip
            if searching:
                wall, cpu, _ = parse(path, bulk=False)
                print(f"  searching path only (bulk off, once): {wall:.2f} s (CPU {cpu:.2f} s), "
                      f"ratio {wall / r:.1f}; bulk is {wall / p:.1f}x faster")  # fmt: skip
            path.unlink()


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


class Session:
    name = "local"

    def __init__(self, client: AgentClient) -> None:
        self.client = client

    def call(self, op, args=None, timeout=30.0):  # type: ignore[no-untyped-def]
        return self.client.request(op, args, timeout=timeout)


def bench_follow(seconds: float, step_interval: float, poll: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        log_dir = Path(tmp)
        writer = AReaLLogWriter(log_dir, mode="spmd")
        for s in range(2000):
            writer.now = time.time() - 2000 + s
            writer.commit(0, s, s, actor_stats(s))
        log = log_dir / "trainer.log"
        stop = threading.Event()

        def write() -> None:
            s = 2000
            while not stop.wait(step_interval):
                writer.now = time.time()
                writer.commit(0, s, s, actor_stats(s))
                s += 1

        channel = LocalChannel()
        client = AgentClient(channel)
        client.start()
        agent_pid = client.request("hello")["pid"]
        follower = MetricsFollower(str(log), NodeFiles(Session(client)))
        follower.poll()  # catching up with the 2,000 steps is not the steady cost
        summarize(follower.store)
        results: dict[str, float] = {}

        def follow() -> None:
            cpu0, polls, new_total = time.thread_time(), 0, 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                new = follower.poll()
                follower.report()
                if new:
                    summarize(follower.store)
                    follower.store.series("ppo_actor/task_reward/avg")
                polls += 1
                new_total += new
                time.sleep(poll)
            results["cpu"] = time.thread_time() - cpu0
            results["polls"] = polls
            results["steps"] = new_total

        agent0 = cpu_of(agent_pid)
        wall0 = time.monotonic()
        feeder = threading.Thread(target=write)
        feeder.start()
        follower_thread = threading.Thread(target=follow)
        follower_thread.start()
        follower_thread.join()
        wall = time.monotonic() - wall0
        agent_cpu = cpu_of(agent_pid) - agent0
        stop.set()
        feeder.join()

        # Baseline, same run: the whole file read and parsed again at every poll.
        t0 = time.thread_time()
        for _ in range(3):
            parser = LogParser()
            parser.feed(log.read_bytes())
        naive = (time.thread_time() - t0) / 3
        client.close()
        writer.release()

    print(
        f"following {log.name}: {wall:.0f} s, a step every {step_interval:g} s, poll every {poll:g} s"
    )
    print(f"  {results['polls']:.0f} polls, {results['steps']:.0f} new steps read")
    print(f"  agent (node side):     {100 * agent_cpu / wall:.2f} % of one core")
    print(f"  console (poll thread): {100 * results['cpu'] / wall:.2f} % of one core")
    print(f"  baseline, re-read and re-parse the whole file each poll: "
          f"{100 * naive / poll:.1f} % of one core ({naive * 1000:.0f} ms a poll)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("parse")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--metrics", default="9,83", help="table widths, comma-separated")
    p.add_argument("--searching", action="store_true")
    p.add_argument("--report", action="store_true", help="also time the health report")
    f = sub.add_parser("follow")
    f.add_argument("--seconds", type=float, default=30.0)
    f.add_argument("--step-interval", type=float, default=1.0)
    f.add_argument("--poll", type=float, default=2.0)
    args = parser.parse_args()
    if args.what == "parse":
        widths = [int(w) for w in args.metrics.split(",")]
        bench_parse(args.steps, args.repeats, widths, args.searching, args.report)
    else:
        bench_follow(args.seconds, args.step_interval, args.poll)


if __name__ == "__main__":
    main()
