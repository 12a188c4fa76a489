"""Render the Stacks screen on a recorded capture to screenshots/stacks.svg.

PYTHONPATH=tui:agents python scripts/stacks_screenshot.py [--diff] [--text]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path

from areal_console.core.stacks.model import build_capture
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.rank_group_table import RankGroupTable
from textual.app import App

ROOT = Path(__file__).resolve().parents[1]


async def render(pattern: str, diff: bool) -> str:
    raw = json.loads((ROOT / "tests" / "data" / "pyspy" / f"{pattern}.json").read_text())
    raw["id"] = f"recorded-{pattern}"
    screen = StacksScreen(build_capture(raw))

    class Shot(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen)

    app = Shot()
    async with app.run_test(size=(140, 42)) as pilot:
        while not (screen.analysis and screen.query_one(RankGroupTable).shown):
            await pilot.pause(0.02)
        if diff:
            screen.query_one(RankGroupTable).focus()
            await pilot.press("space", "j", "space", "d")
        await pilot.pause(0.2)
        return app.export_screenshot(title=f"areal-console stacks: {pattern}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pattern", default="cleanup_deadlock")
    parser.add_argument("--diff", action="store_true")
    parser.add_argument("--text", action="store_true", help="print the text, don't save")
    args = parser.parse_args()
    svg = asyncio.run(render(args.pattern, args.diff))
    if args.text:
        rows = re.findall(r'<text class="[^"]*" x="[^"]*" y="([^"]*)"[^>]*>([^<]*)</text>', svg)
        lines: dict[float, str] = {}
        for y, t in rows:
            lines[float(y)] = lines.get(float(y), "") + t
        print("\n".join(v.replace("&#160;", " ") for _, v in sorted(lines.items())))
        return 0
    suffix = "-diff" if args.diff else ""
    out = ROOT / "screenshots" / f"stacks{suffix}.svg"
    out.parent.mkdir(exist_ok=True)
    out.write_text(svg)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
