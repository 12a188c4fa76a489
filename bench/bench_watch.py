"""What `areal-console watch` costs over time: CPU per hour and memory growth (a soak).

    python -m bench.bench_watch [--minutes 60] [--interval 30] [--stall-after 900] [--recover]

Starts the demo's hung job (the reference trainer, 2 ranks, hung in its cleanup: its log
quiet, so the watch samples its stacks with py-spy on every look, its most expensive
steady state), then for `--minutes`, at the same time on the same job:
- the watch: `areal-console watch --local --match JOB --logs LOG --json` at `--interval`
  (default: the watch's default, 30 s) and `--stall-after` (default 900 s: no stall within
  a short soak, so every look samples the stacks);
- the baseline: what one would script by hand, `py-spy dump --nonblocking --pid P` for
  each rank every `--interval` seconds (run from this process; its children's CPU).
With `--recover` the watch follows a log the bench writes instead of the demo's (steps as
AReaL's StatsLogger prints them, by the reference trainer's own writer): one step at the
start, and one more after each `evidence` event, as a job that moves again would. So the
hour holds stall, evidence, recovered, then the next stall `--stall-after` later, and so
on: every stall's evidence (written by the watch's child process) is inside the soak.
Reported: CPU seconds per hour and % of one core for each (the watch's own process with
its reaped children: its in-process agent runs py-spy, and its evidence child), their
ratio, and the watch's RSS after its first look, at each evidence and at the end (growth,
the bound is 5 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and its reaped children, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    # fields[0] is state (field 3): utime, stime, cutime, cstime are fields 14-17.
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def baseline_loop(pids: list[int], interval: float, stop: threading.Event) -> int:
    """`py-spy dump --nonblocking` of each rank every `interval`: dumps taken."""
    pyspy = shutil.which("py-spy") or "py-spy"
    done = 0
    while not stop.is_set():
        started = time.monotonic()
        for pid in pids:
            subprocess.run([pyspy, "dump", "--nonblocking", "--pid", str(pid)],
                           capture_output=True, timeout=60, check=False)  # fmt: skip
            done += 1
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return done


class Events:
    """The watch's events as they come (one JSON object a line on its stdout); with
    `log`, one step logged after each `evidence` (the job moving again)."""

    def __init__(self, watch: subprocess.Popen[str], log: Path | None) -> None:
        self.watch = watch
        self.log = log
        self.seen: list[tuple[str, float, int]] = []  # (event, minutes since t0, RSS kB)
        self.t0 = time.monotonic()
        self.steps = 1
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.watch.stdout is not None
        for line in self.watch.stdout:
            event = json.loads(line)["event"]
            rss = rss_kb(self.watch.pid) if self.watch.poll() is None else 0
            self.seen.append((event, (time.monotonic() - self.t0) / 60, rss))
            print(f"  {time.strftime('%H:%M:%S')} {event}, watch RSS {rss / 1024:.1f} MB",
                  flush=True)  # fmt: skip
            if event == "evidence" and self.log is not None:
                self.steps += 1
                log_step(self.log, self.steps)


def log_step(log: Path, step: int) -> None:
    """One step's record, as AReaL's StatsLogger prints it (the reference trainer's writer)."""
    from areal_node.trainer.areal_log import areal_log_line, stats_table

    now = time.time()
    lines = [areal_log_line(f"Epoch 1/1 Step {step}/100000 Train step {step}/100000 done.", now),
             areal_log_line("Stats (1/1):", now),
             areal_log_line("\n" + stats_table({"timeperf/train_step": 1.0}), now)]  # fmt: skip
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def _is_rank(ps_line: str) -> bool:
    """A rank of the demo (`pgrep -af`): the trainer started by torchrun with `python -u`
    (`-m areal_node.trainer`, or the `-c` launch that runs that module), not the launcher
    nor torchrun itself."""
    return ("areal_node.trainer" in ps_line and " -u " in ps_line
            and "torch.distributed.run" not in ps_line)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="soak length (default 60)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between looks")
    parser.add_argument("--stall-after", type=float, default=900.0)
    parser.add_argument("--recover", action="store_true",
                        help="log a step after each evidence: stalls and recoveries in turn")  # fmt: skip
    args = parser.parse_args()

    from areal_console.core.replay.demo import new_demo

    job = new_demo("cleanup", nproc=2, dump_steps=1)
    work = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    env = {**os.environ, "AREAL_CONSOLE_DATA_DIR": str(work / "data"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])}  # fmt: skip
    watch = None
    try:
        job.start()
        job.wait_ready(timeout=300)
        ranks = sorted(int(line.split()[0]) for line in subprocess.run(
            ["pgrep", "-af", f"-u{os.getuid()}", job.tag], capture_output=True, text=True,
            check=False).stdout.splitlines() if _is_rank(line))  # fmt: skip
        if len(ranks) != 2:
            raise SystemExit(f"expected the demo's 2 ranks, found {ranks}")
        stderr = open(work / "watch.err", "w")  # noqa: SIM115 (closed below)
        log = work / "steps.log" if args.recover else None
        if log is not None:
            log_step(log, 1)
        watch = subprocess.Popen(
            [sys.executable, "-m", "areal_console", "watch", "--local", "--match", job.tag,
             "--logs", str(log or job.log_path), "--interval", str(args.interval),
             "--stall-after", str(args.stall_after), "--evidence", str(work / "ev"), "--json"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
        )  # fmt: skip
        # Its start (imports, the first look) is not the steady state: measured after it.
        deadline = time.monotonic() + 120
        while "following" not in (work / "watch.err").read_text():
            if time.monotonic() > deadline or watch.poll() is not None:
                raise SystemExit(f"the watch did not start: {(work / 'watch.err').read_text()}")
            time.sleep(0.2)
        events = Events(watch, log)
        time.sleep(min(args.interval, 30.0) + 1)  # past its first stack sample
        stop = threading.Event()
        counted: list[int] = []
        base_cpu0 = children_cpu()
        thread = threading.Thread(
            target=lambda: counted.append(baseline_loop(ranks, args.interval, stop)), daemon=True
        )
        cpu0, rss0, t0 = cpu_seconds(watch.pid), rss_kb(watch.pid), time.monotonic()
        events.t0 = t0
        print(f"bench: watch pid {watch.pid} on the demo's ranks {ranks}, measuring "
              f"{args.minutes:g} min from {time.strftime('%H:%M:%S')} (RSS {rss0 / 1024:.1f} MB)",
              flush=True)  # fmt: skip
        thread.start()
        peak = rss0
        end = t0 + args.minutes * 60
        trail: list[tuple[float, int]] = []  # (minutes, RSS kB) every 10 s
        while time.monotonic() < end and watch.poll() is None:
            time.sleep(min(10.0, max(0.0, end - time.monotonic())))
            trail.append(((time.monotonic() - t0) / 60, rss_kb(watch.pid)))
            peak = max(peak, trail[-1][1])
        cpu1, rss1, t1 = cpu_seconds(watch.pid), rss_kb(watch.pid), time.monotonic()
        stop.set()
        thread.join()
        base_cpu = children_cpu() - base_cpu0
        wall = t1 - t0
        watch.send_signal(signal.SIGTERM)
        code = watch.wait(timeout=120)
        events.thread.join(timeout=60)
        stderr.close()
        watch_cpu = cpu1 - cpu0
        looks = wall / args.interval
        print(
            f"soak: {wall / 60:.1f} min, a look every {args.interval:g}s (~{looks:.0f} looks), "
            f"stall-after {args.stall_after:g}s; 2 ranks, hung (stacks sampled every look)"
        )
        print(
            f"watch:    {watch_cpu:.2f} CPU s = {watch_cpu / wall * 3600:.1f} CPU s/hour = "
            f"{watch_cpu / wall * 100:.3f}% of a core"
        )
        print(
            f"baseline: {base_cpu:.2f} CPU s = {base_cpu / wall * 3600:.1f} CPU s/hour = "
            f"{base_cpu / wall * 100:.3f}% of a core ({counted[0] if counted else 0} py-spy dumps)"
        )
        if base_cpu > 0:
            print(f"ratio watch/baseline: {watch_cpu / base_cpu:.2f}")
        print(
            f"watch RSS: {rss0 / 1024:.1f} MB after its first look, {rss1 / 1024:.1f} MB at "
            f"the end (peak {peak / 1024:.1f} MB): growth {(rss1 - rss0) / 1024:+.2f} MB"
        )
        tenth = max(1, len(trail) // 10)
        shown = ", ".join(f"{m:.1f} min {kb / 1024:.1f}" for m, kb in trail[tenth - 1 :: tenth])
        print(f"watch RSS (MB) over the soak: {shown}")
        half = [kb for m, kb in trail if m >= args.minutes / 2]
        if half:
            print(f"second half: {min(half) / 1024:.1f}-{max(half) / 1024:.1f} MB "
                  f"(growth within it {(half[-1] - half[0]) / 1024:+.2f} MB)")  # fmt: skip
        print("events (minute, watch RSS MB): " + ", ".join(
            f"{e} {m:.1f} {kb / 1024:.1f}" for e, m, kb in events.seen))  # fmt: skip
        print(f"exit {code} on SIGTERM")
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
        job.stop()
        job.remove_files()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
