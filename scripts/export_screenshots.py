"""Render each screen to SVG in screenshots/ from recorded, deterministic data.

python scripts/export_screenshots.py
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT / "tests")]

from areal_console.app import ConsoleApp  # noqa: E402
from textual.app import App  # noqa: E402
from textual.pilot import Pilot  # noqa: E402

SIZE = (130, 36)
OUT = ROOT / "screenshots"


async def render(
    name: str, app: App[None], steps: Callable[[Pilot[None]], Awaitable[None]] | None = None
) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        if steps is not None:
            await steps(pilot)
        await pilot.pause()
        svg = app.export_screenshot(title="areal-console")
    (OUT / f"{name}.svg").write_text(svg)
    print(f"wrote screenshots/{name}.svg")


async def main() -> None:
    from recorded import recorded_monitor

    await render("cluster", ConsoleApp(None, recorded_monitor()))


if __name__ == "__main__":
    asyncio.run(main())
