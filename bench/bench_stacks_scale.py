"""Stacks at AReaL's scale: 4,096 ranks read back, saved captures listed, the screens.

    PYTHONPATH=tui:agents:. python -m bench.bench_stacks_scale [--ranks 1024,4096]
        [--repeat 3] [--saved 30] [--baseline OTHER_CHECKOUT] [--skip-screens]

The job: `--ranks` AReaL workers (8 per node, one py-spy text file per node as the
debugging guide's loop writes it), three threads of ~50 frames each, all from recorded
dumps (tests/support/fixtures/pyspy_scale.py); all but a few wait in a barrier.

1. Import and reopen, whole processes (`python -m areal_console stacks --import FILES`,
   then `stacks --open ID`): wall time, CPU time (user + system) and peak resident size of
   each. With `--baseline`, the same commands from another checkout (its `tui/` and
   `agents/` on PYTHONPATH), interleaved: an older one refuses more than 200,000 frames.
2. Saved captures: `--saved` captures of ~3 MB each (256 ranks) in one data directory;
   `stacks --list` and `stacks --open latest` with the index (`captures/.index`) against
   the same commands with the index deleted before each run (every capture parsed, as
   before the index), in the same run.
3. Screens (in this process, Textual headless): seconds from pushing the Stacks screen
   with the `--ranks` capture to its diagnosis and groups shown; the command palette on a
   console watching 512 nodes x 8 ranks (one entry per rank): seconds to search all
   entries for a rank.

Medians of `--repeat`. The console runs with bytecode caching (`PYTHONPYCACHEPREFIX`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from tests.support.fixtures.pyspy_scale import write_job  # noqa: E402


def env_for(checkout: Path, data: Path, pycache: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout / "tui"), str(checkout / "agents")])
    env["AREAL_CONSOLE_DATA_DIR"] = str(data)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(args: list[str], env: dict[str, str]) -> tuple[float, float, int, int, str]:
    """(wall s, CPU s, peak RSS MB, exit code, stdout) of one console process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_console", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss // 1024, proc.returncode, out


def median_runs(args: list[str], env: dict[str, str], repeat: int, before: Any = None) -> dict:
    rows = []
    for _ in range(repeat):
        if before is not None:
            before()
        rows.append(run(args, env))
    return {
        "wall": statistics.median(r[0] for r in rows),
        "cpu": statistics.median(r[1] for r in rows),
        "rss": max(r[2] for r in rows),
        "code": rows[-1][3],
        "out": rows[-1][4],
    }


def line(label: str, m: dict, base: dict | None = None) -> str:
    text = f"  {label:<44} {m['wall']:6.3f}s wall {m['cpu']:6.3f}s cpu {m['rss']:5d} MB"
    if m["code"] != 0:
        text += f"  exit {m['code']}"
    if base is not None and base["code"] == 0 and m["code"] == 0:
        text += f"  ({m['cpu'] / base['cpu']:.2f}x cpu of the baseline)"
    return text


def bench_import(sizes: list[int], repeat: int, baseline: Path | None, tmp: Path) -> None:
    pycache = str(tmp / "pycache")
    print(f"\n1. stacks --import and --open, whole process (median of {repeat})")
    for ranks in sizes:
        files = write_job(tmp / f"job{ranks}", ranks)
        size = sum(p.stat().st_size for p in files) / 1e6
        print(f" {ranks} ranks, {len(files)} files, {size:.1f} MB of py-spy text, "
              f"{ranks * 150:,} frames")  # fmt: skip
        env = env_for(ROOT, tmp / f"data{ranks}", pycache)
        args = ["stacks", "--import", *map(str, files)]
        this = median_runs(args, env, repeat)
        base = None
        if baseline is not None:
            benv = env_for(baseline, tmp / f"base{ranks}", pycache)
            base = median_runs(args, benv, repeat)
            print(line("baseline checkout: --import", base))
        print(line("this checkout: --import", this, base))
        if this["code"] != 0:
            continue
        capture_id = this["out"].split()[2]
        opened = median_runs(["stacks", "--open", capture_id], env, repeat)
        print(line("this checkout: --open ID", opened))
        assert opened["out"] == this["out"], "reopened capture differs"
        if base is not None and base["code"] == 0:
            base_id = base["out"].split()[2]
            b_open = median_runs(["stacks", "--open", base_id], benv, repeat)
            print(line("baseline checkout: --open ID", b_open))
            print(line("this checkout: --open ID", opened, b_open))


def bench_index(saved: int, repeat: int, tmp: Path) -> None:
    data = tmp / "saved"
    env = env_for(ROOT, data, str(tmp / "pycache"))
    files = write_job(tmp / "job256", 256)
    made = run(["stacks", "--import", *map(str, files)], env)
    assert made[3] == 0, "import failed"
    captures = data / "captures"
    (first,) = list(captures.glob("*.json"))
    doc = json.loads(first.read_text())
    for i in range(1, saved):
        doc["id"] = f"20260101-0000{i:02d}-copy"
        (captures / f"{doc['id']}.json").write_text(json.dumps(doc, separators=(",", ":")))
    mb = sum(p.stat().st_size for p in captures.glob("*.json")) / saved / 1e6
    index = captures / ".index"
    print(f"\n2. {saved} saved captures of {mb:.1f} MB each (median of {repeat})")

    def drop_index() -> None:
        index.unlink(missing_ok=True)

    for args in (["stacks", "--list"], ["stacks", "--open", "latest"]):
        full = median_runs(args, env, repeat, drop_index)
        run(args, env)  # the index is back
        indexed = median_runs(args, env, repeat)
        print(line(f"{' '.join(args)}: every capture parsed", full))
        print(line(f"{' '.join(args)}: from the index", indexed, full))
    shutil.rmtree(captures)


def bench_screen(ranks: int, repeat: int) -> None:
    import asyncio

    from areal_console.screens.stacks import StacksScreen
    from areal_console.widgets.diagnosis_banner import DiagnosisBanner
    from areal_console.widgets.rank_group_table import RankGroupTable
    from textual.app import App

    from tests.support.recorded import scale_capture

    times = []
    for _ in range(repeat):
        capture = scale_capture(ranks)
        screen = StacksScreen(capture)

        async def shown(s: StacksScreen = screen) -> float:
            class Bench(App[None]):
                def on_mount(self) -> None:
                    self.push_screen(s)

            async with Bench().run_test(size=(160, 45)) as pilot:
                t0 = time.perf_counter()
                while not (s.analysis and s.query_one(RankGroupTable).shown):
                    await pilot.pause(0.005)
                await pilot.pause()
                took = time.perf_counter() - t0
                banner = s.query_one(DiagnosisBanner)
                assert getattr(banner, "diagnosis", None) is not None, "no diagnosis shown"
                return took

        times.append(asyncio.run(shown()))
    print(f"\n3. Stacks screen, {ranks} ranks: diagnosis and groups shown "
          f"{statistics.median(times):.3f}s after the screen opens (median of {repeat})")  # fmt: skip


def bench_palette(repeat: int) -> None:
    import asyncio

    from areal_console.app import ConsoleApp
    from areal_console.core.connection.monitor import RecordedMonitor
    from areal_console.palette import ConsoleCommands

    from tests.support.recorded import scale_views

    views = scale_views(512, 8)
    app = ConsoleApp(None, RecordedMonitor(views))

    async def search() -> tuple[float, int]:
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.pause()
            provider = ConsoleCommands(app.screen)
            times, found = [], 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                hits = [h async for h in provider.search("rank 4095")]
                times.append(time.perf_counter() - t0)
                found = len(hits)
            return statistics.median(times), found

    took, found = asyncio.run(search())
    ranks = sum(len(v.processes) for v in views)
    print(f"   palette on 512 nodes x 8 ranks ({ranks} rank entries): one search "
          f"{took:.3f}s, {found} hits (median of {repeat})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096", help="job sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--saved", type=int, default=30)
    parser.add_argument("--baseline", type=Path, help="another checkout, for --import/--open")
    parser.add_argument("--skip-screens", action="store_true")
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",") if x]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-stacks-scale-") as name:
        tmp = Path(name)
        bench_import(sizes, args.repeat, args.baseline.resolve() if args.baseline else None, tmp)
        bench_index(args.saved, args.repeat, tmp)
    if not args.skip_screens:
        bench_screen(max(sizes), args.repeat)
        bench_palette(args.repeat)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
