"""TUI: the keypress `s` on the Cluster screen to the diagnosis on the Stacks screen, against
the CPU floor of the same dumps.

    flock /tmp/areal-heavy.lock python bench/bench_tui_capture.py --ranks 16 --repeat 5

A real hung gloo job (`collective_mismatch` scenario) runs on this machine. The console is
the real app on the real local node (agent, monitor at 1 Hz), driven headless with Pilot in
this process. Each repeat, interleaved so background load hits both alike:

- floor: every rank's `py-spy dump` at once (`py-spy dump ... &` for each, then `wait`);
- console: press `s` on the Cluster screen, filtered to this job (other jobs may run on
  a shared machine; if the job dialog still opens, the bench chooses this job at once, on
  the clock); the clock stops when the Stacks screen holds
  the new capture's diagnosis (`1` goes back before the next repeat).

Prints medians and the ratio to the floor (the bar: at most 1.5x at 16 ranks).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from bench.bench_capture import job_port  # noqa: E402
from tests.support.fixtures.hang import start_scenario  # noqa: E402


def floor_seconds(pids: list[int]) -> float:
    ids = " ".join(map(str, pids))
    script = f"for pid in {ids}; do py-spy dump --pid $pid >/dev/null & done; wait"
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", script], check=True)
    return time.perf_counter() - t0


async def diagnosis_shown(app: Any, before: str | None, job: str) -> float:
    """When the Stacks screen holds a capture newer than `before` with its diagnosis.
    Polls between the app's own messages: `pilot.press` returns only once the app is idle
    again, later than the diagnosis is on screen."""
    from areal_console.dialogs.job_choice import JobChoiceDialog
    from areal_console.screens.stacks import StacksScreen

    deadline = time.monotonic() + 120
    while True:
        screen = app._stacks_screen
        capture = screen.capture if isinstance(screen, StacksScreen) else None
        if (
            capture is not None
            and capture.capture_id != before
            and screen.diagnosis is not None
            and app.screen is screen
        ):
            return time.perf_counter()
        if isinstance(app.screen, JobChoiceDialog):
            # Other jobs run here too (a shared machine): choose ours at once, as the
            # user's enter would; the clock keeps running.
            app.screen.dismiss(job)
        if time.monotonic() > deadline:
            raise SystemExit("the diagnosis never showed")
        await asyncio.sleep(0.002)


async def console_seconds(
    pids: list[int], job: str, tag: str, repeat: int, floor: list[float]
) -> list[float]:
    from areal_console.app import create_app
    from areal_console.core.targets.resolve import local_node
    from textual.widgets import DataTable

    app = create_app([local_node()], refresh_interval=1.0, initial_filter=tag)
    times: list[float] = []
    async with app.run_test(size=(160, 45)) as pilot:
        table = app.screen.query_one("#processes", DataTable)
        deadline = time.monotonic() + 120
        while table.row_count < len(pids):  # the monitor has sampled the ranks
            if time.monotonic() > deadline:
                raise SystemExit(f"the console never showed {len(pids)} ranks")
            await pilot.pause(0.1)
        await pilot.pause(1.5)
        for _ in range(repeat):
            floor.append(floor_seconds(pids))
            await pilot.pause(1.5)  # a fresh monitor sample, as a user's pause would give
            screen = app._stacks_screen
            before = screen.capture.capture_id if screen and screen.capture else None
            watcher = asyncio.create_task(diagnosis_shown(app, before, job))
            t0 = time.perf_counter()
            await pilot.press("s")
            end = await watcher
            capture = app._stacks_screen.capture
            ok = [r for r in capture.ranks if r.state == "ok"]
            assert len(ok) == len(pids), (len(ok), len(pids))
            times.append(end - t0)
            await pilot.press("1")
        await pilot.press("q")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as home:
        os.environ.setdefault("AREAL_CONSOLE_DATA_DIR", os.path.join(home, "data"))
        os.environ.setdefault("AREAL_CONSOLE_CONFIG_DIR", os.path.join(home, "config"))
        # A state directory of its own names this job in its ranks' command lines: the
        # Cluster screen's filter (`/`, here set up front) narrows `s` to it, as a user
        # would on a node shared with other jobs.
        state = tempfile.mkdtemp(prefix="bench-tui-job-", dir=home)
        with start_scenario("collective_mismatch", nproc=args.ranks, state_dir=state) as scenario:
            scenario.wait_ready(900)
            pids = scenario.rank_pids()
            floor: list[float] = []
            job = f"127.0.0.1:{job_port(pids[0])}"
            console = asyncio.run(
                console_seconds(pids, job, os.path.basename(state), args.repeat, floor)
            )
    f, c = statistics.median(floor), statistics.median(console)
    print(
        f"{args.ranks} ranks, median of {args.repeat} ({os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    print(f"  all dumps at once (floor)      {f:.3f}s  (min {min(floor):.3f}s)")
    print(f"  s -> diagnosis on screen       {c:.3f}s  (min {min(console):.3f}s)")
    print(f"  console / floor                {c / f:.2f}x  (bar: 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
