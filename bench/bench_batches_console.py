"""A ~1 GB dump's summary inside a running console vs the same summary in a bare process.

The console: the real app on the real local node (its monitor samples the node every
second, as in use), driven headless with Pilot; `3` opens the Batches screen on the dump
file and the clock runs until the file's statistics are on screen. Peak memory is the
growth of the console process's VmHWM over that work ("peak MB": it counts the file's
pages mapped from the page cache, which the kernel may map in large units when the file
is cached) and of its anonymous memory alone ("anon MB", sampled every 2 ms: the memory the
work itself took).

The anchor, measured in the same run: `batches.summarize` of the same file in a fresh
process with nothing else running in it (torch already initialised, as in the console).

Both sides run in fresh processes, interleaved (anchor, console, anchor, ...), with the
file's pages warm, so background load hits both alike. Prints medians and the ratio.

    python bench/bench_batches_console.py [--gb 1.0] [--repeat 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from bench.bench_batches import benchmark_dump  # noqa: E402  (the same dump file)

COMMON = r"""
import json, os, sys, time
import torch

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

class AnonPeak:
    # The process's largest anonymous resident memory while it runs (sampled every 2 ms):
    # memory of its own, without the file's pages mapped from the page cache.

    def __enter__(self):
        import threading
        self.start = self.peak = anon_kb()
        self.done = threading.Event()
        def watch():
            while not self.done.wait(0.002):
                self.peak = max(self.peak, anon_kb())
        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, anon_kb())

    @property
    def growth_mb(self):
        return (self.peak - self.start) / 1024

def warm(path):
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 16 << 20):
        pass
    os.close(fd)

path = sys.argv[1]
torch.zeros(1).sum()  # torch's lazy init is part of neither side
"""

ANCHOR = (
    COMMON
    + r"""
from areal_node import batches
warm(path)
before = peak_kb()
with AnonPeak() as anon:
    t0 = time.perf_counter()
    s = batches.summarize(path, eos_token_id=2)
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "samples": s["samples"],
                  "peak_growth_mb": (peak_kb() - before) / 1024, "anon_mb": anon.growth_mb}))
"""
)

CONSOLE = (
    COMMON
    + r"""
import asyncio
from areal_console.app import create_app
from areal_console.core.targets.resolve import local_node
from areal_console.screens.batches import BatchesScreen
from textual.widgets import Static

async def main():
    app = create_app([local_node()], batches_path=path, refresh_interval=1.0)
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 60
        await pilot.pause(3.0)  # the monitor has sampled the node a few times: in use
        warm(path)
        before = peak_kb()
        shown = asyncio.get_running_loop().create_future()

        async def watch():
            # Polls between the app's own messages (pilot.press returns only once the app
            # is idle again, after the samples table too).
            while True:
                screen = app.screen
                if isinstance(screen, BatchesScreen) and screen.file_summary is not None:
                    shown.set_result(time.perf_counter())
                    return
                if time.monotonic() > deadline:
                    shown.set_exception(SystemExit("timed out waiting for the summary"))
                    return
                await asyncio.sleep(0.002)

        with AnonPeak() as anon:
            watcher = asyncio.create_task(watch())
            t0 = time.perf_counter()
            await pilot.press("3")
            end = await shown
            await watcher
        screen = app.screen
        seconds = end - t0
        text = str(screen.query_one("#summary", Static).render())
        assert "reward" in text, text
        print(json.dumps({"seconds": seconds, "samples": screen.file_summary.samples,
                          "peak_growth_mb": (peak_kb() - before) / 1024,
                          "anon_mb": anon.growth_mb}))
        await pilot.press("q")

asyncio.run(main())
"""
)


def run(script: str, path: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])}
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="dump size in GB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", metavar="DIR", help="write the dump here and keep it")
    args = parser.parse_args()

    path, tmp = benchmark_dump(args.keep, args.gb)
    print(
        f"cpu cores: {os.cpu_count()}, file {path.stat().st_size / (1 << 20):.0f} MiB, "
        f"repeat {args.repeat}, fresh processes, warm page cache"
    )
    anchor: list[dict[str, float]] = []
    console: list[dict[str, float]] = []
    for _ in range(args.repeat):
        anchor.append(run(ANCHOR, path))
        console.append(run(CONSOLE, path))
    assert {r["samples"] for r in anchor} == {r["samples"] for r in console}
    print(f"\n{'side':<34} {'min s':>7} {'median s':>9} {'peak MB':>8} {'anon MB':>8}")
    for name, rs in (
        ("summary, bare process (anchor)", anchor),
        ("summary in the console", console),
    ):
        secs = [r["seconds"] for r in rs]
        peak = statistics.median(r["peak_growth_mb"] for r in rs)
        anon = statistics.median(r["anon_mb"] for r in rs)
        print(
            f"{name:<34} {min(secs):>7.3f} {statistics.median(secs):>9.3f} {peak:>8.0f} {anon:>8.0f}"
        )
    ratio = statistics.median(r["seconds"] for r in console) / statistics.median(
        r["seconds"] for r in anchor
    )
    print(f"\nconsole / anchor (medians): {ratio:.2f}x")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
