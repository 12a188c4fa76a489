"""TUI: from pressing `s` on the Cluster screen to the diagnosis shown, against the floor.

    flock /tmp/areal-heavy.lock python bench/bench_tui_capture.py --ranks 16 --repeat 5

A real hung gloo job (`collective_mismatch` scenario) runs on this machine and the real
console (`ConsoleApp` over a local fleet, headless, driven by Textual's Pilot) watches it.
Each repeat, on the Cluster screen: press `s`, then wait until the Stacks screen holds a
new analysis with its diagnosis in the banner. Timed: keypress -> diagnosis shown.

The anchor, in the same run and interleaved with the console: the floor of dumping these
processes, every `py-spy dump` at once (`py-spy dump ... &` each, then `wait`).

When the node runs other jobs too (other users' test jobs on a shared machine), `s` would
first ask which job to capture; the benchmark then does what `s` does on a Cluster screen
filtered to this job (`action_capture_stacks(match=...)`, the filter as the match), so the
dialog is not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT)]

from areal_console.app import ConsoleApp  # noqa: E402
from areal_console.core.fleet import Fleet  # noqa: E402
from areal_console.core.stacks.capture import scope_processes  # noqa: E402
from areal_console.core.stacks.scope import JobChoiceError  # noqa: E402
from areal_console.core.targets import local_node  # noqa: E402
from areal_console.screens.cluster import ClusterScreen  # noqa: E402
from areal_console.screens.stacks import StacksScreen  # noqa: E402
from areal_console.widgets.diagnosis_banner import DiagnosisBanner  # noqa: E402

from tests.fixtures.hang import start_scenario  # noqa: E402


def floor(pids: list[int]) -> float:
    ids = " ".join(map(str, pids))
    cmd = f"for pid in {ids}; do py-spy dump --pid $pid >/dev/null & done; wait"
    t0 = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True)
    return time.perf_counter() - t0


async def until(condition: object, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g}s for {what}")
        await asyncio.sleep(0.002)


async def measure(pids: list[int], marker: str, repeat: int) -> tuple[list[float], list[float]]:
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.5)
    keypress: list[float] = []
    floors: list[float] = []
    async with app.run_test(size=(160, 50)) as pilot:

        def sampled() -> set[int]:
            return {p.pid for v in app.monitor.snapshot() for p in v.processes}

        await until(lambda: set(pids) <= sampled(), "the monitor to see the job")
        try:
            scope_processes(app._latest_processes(), app.capture_options())
            several = False
        except JobChoiceError:
            several = True  # other jobs on this machine: capture this one, as a filter does
        print(
            "  (other jobs on this machine: `s` with the Cluster filter set to this job)"
            if several
            else "  (only this job on this machine: a bare `s`)"
        )
        previous = None
        for i in range(repeat + 1):  # the first round warms imports and the page cache
            app.switch_mode("nodes")
            await until(lambda: isinstance(app.screen, ClusterScreen), "the Cluster screen")
            await pilot.pause()
            t0 = time.perf_counter()
            if several:
                app.action_capture_stacks(match=marker)
            else:
                await pilot.press("s")
            await until(
                lambda before=previous: (
                    isinstance(app.screen, StacksScreen)
                    and app.screen.analysis is not None
                    and app.screen.analysis is not before
                    and app.screen.diagnosis is not None
                ),
                "the diagnosis",
            )
            elapsed = time.perf_counter() - t0
            screen = app.screen
            assert isinstance(screen, StacksScreen) and screen.analysis is not None
            previous = screen.analysis
            banner = str(screen.query_one(DiagnosisBanner).render())
            assert screen.diagnosis is not None and screen.diagnosis.title in banner, banner
            ranks = {r.pid for r in screen.analysis.capture.ranks if r.state == "ok"}
            assert ranks == set(pids), (sorted(ranks), sorted(pids))
            if i:
                keypress.append(elapsed)
                floors.append(floor(pids))
    return keypress, floors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with start_scenario("collective_mismatch", nproc=args.ranks) as job:
        job.wait_ready(900)
        pids = job.rank_pids()
        print(f"{args.ranks}-rank job up; {os.cpu_count()} CPUs")
        keypress, floors = asyncio.run(measure(pids, str(job.state_dir), args.repeat))
    k, f = statistics.median(keypress), statistics.median(floors)
    print(
        f"\nkeypress -> diagnosis, {args.ranks} ranks (median of {args.repeat}; "
        f"load average {os.getloadavg()[0]:.1f})"
    )
    print(f"  all dumps at once (floor)   {f:.3f}s   ({', '.join(f'{x:.3f}' for x in floors)})")
    print(f"  console: `s` -> diagnosis   {k:.3f}s   ({', '.join(f'{x:.3f}' for x in keypress)})")
    print(f"  console / floor             {k / f:.2f}x   (bar: 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
