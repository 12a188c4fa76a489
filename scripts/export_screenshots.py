"""Render every top-level screen to SVG in screenshots/ from recorded, deterministic data.

python scripts/export_screenshots.py [--text]

Cluster, Stacks (and a side-by-side diff), Batches, Jobs and Health, each in the real app shell at
130x36: recorded agent samples, recorded py-spy captures, a seeded dump written with
torch.save and recorded replay runs; no clock, no host names, no pids of this machine.
`--text` prints each screen's text instead of writing files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT / "tests"), str(ROOT)]
OUT = ROOT / "screenshots"


def svg_text(svg: str) -> str:
    """The screen's text lines, from the SVG (for a quick look in a terminal)."""
    rows = re.findall(r'<text class="[^"]*" x="[^"]*" y="([^"]*)"[^>]*>([^<]*)</text>', svg)
    lines: dict[float, str] = {}
    for y, t in rows:
        lines[float(y)] = lines.get(float(y), "") + t
    return "\n".join(v.replace("&#160;", " ") for _, v in sorted(lines.items()))


async def main(text: bool) -> None:
    from textual.app import App
    from textual.pilot import Pilot

    from tests.support import recorded

    async def render(
        name: str, app: App[None], steps: Callable[[Pilot[None]], Awaitable[None]] | None = None
    ) -> None:
        async with app.run_test(size=recorded.SIZE) as pilot:
            await pilot.pause()
            if steps is not None:
                await steps(pilot)
            await pilot.pause()
            svg = app.export_screenshot(title="areal-console")
        if text:
            print(f"--- {name}\n{svg_text(svg)}")
            return
        (OUT / f"{name}.svg").write_text(svg)
        print(f"wrote screenshots/{name}.svg")

    OUT.mkdir(exist_ok=True)
    await render("cluster", recorded.ConsoleApp(None, recorded.recorded_monitor()))
    await render("stacks", recorded.stacks_app(), recorded.open_stacks)
    await render(
        "stacks-diff", recorded.stacks_app(), lambda pilot: recorded.open_stacks(pilot, diff=True)
    )
    recorded.write_batches_dump("dumps")  # relative: the screen shows the path as given
    await render("batches", recorded.batches_app("dumps"), recorded.open_sample)
    await render("jobs", recorded.jobs_app(), recorded.open_jobs)
    await render("health", recorded.health_app("run"), recorded.open_health)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", action="store_true", help="print the text, don't save")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-console-shots-") as home:
        # The console's own files (saved captures, job records) go to a scratch home.
        os.environ["AREAL_CONSOLE_DATA_DIR"] = str(Path(home, "data"))
        for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
            os.environ[var] = str(Path(home, var.lower()))
        os.chdir(home)
        asyncio.run(main(args.text))
