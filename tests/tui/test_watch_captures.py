"""Captures a watch saved show their tag and their report in the command palette."""

from __future__ import annotations

from areal_console.app import ConsoleApp
from areal_console.core.stacks.report import capture_json
from areal_console.core.stacks.store import list_captures, save_capture
from textual.command import CommandList, CommandPalette

from tests.support import recorded
from tests.support.recorded import recorded_monitor
from tests.support.waits import until


async def test_the_palette_shows_a_watch_capture_with_its_tag_and_report() -> None:
    capture = recorded.recorded_capture()
    capture.capture_id = "20260101-000000-watch"
    doc = capture_json(capture)
    doc["tags"] = ["watch"]
    doc["watch"] = {"evidence": "/ev/x", "report": "/ev/x/report.md"}
    save_capture(capture, doc=doc)
    other = recorded.recorded_capture()
    other.capture_id = "20260101-000001-person"
    save_capture(other)
    listed = {c.capture_id: c for c in list_captures()}
    assert listed["20260101-000000-watch"].tags == ("watch",)
    assert (
        listed["20260101-000001-person"].tags == ()
        and listed["20260101-000001-person"].report is None
    )
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(140, 36)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: len(app.saved_captures) == 2, what="the saved captures")
        entries = {label: help_text for label, help_text, _ in app._saved_capture_entries()}
        watch = next(
            label for label in entries if label.startswith("Capture 20260101-000000-watch")
        )
        assert watch.startswith("Capture 20260101-000000-watch [watch]: ")
        assert entries[watch].endswith(" · report: /ev/x/report.md")
        person = next(label for label in entries if "000001-person" in label)
        assert "[watch]" not in person and "report:" not in entries[person]
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"[watch]")
        shown = app.screen.query_one(CommandList)
        await until(pilot, lambda: shown.option_count >= 1, what="the palette's match")
        prompts = [str(shown.get_option_at_index(i).prompt) for i in range(shown.option_count)]
        assert any("000000-watch" in p and "report: /ev/x/report.md" in p for p in prompts), prompts
