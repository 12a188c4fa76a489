"""Captures a watch saved show their tag and their report: in the command palette, on
the Stacks screen that opens one, and in `stacks --open`."""

from __future__ import annotations

import json

from areal_console.app import ConsoleApp
from areal_console.core.stacks.report import capture_json, taken_by
from areal_console.core.stacks.store import list_captures, save_capture
from areal_console.screens.stacks import StacksScreen
from conftest import run_cli
from textual.command import CommandList, CommandPalette
from textual.widgets import Static

from tests.support import recorded
from tests.support.recorded import recorded_monitor
from tests.support.waits import until


async def test_the_palette_shows_a_watch_capture_with_its_tag_and_report() -> None:
    _save_watch_capture()
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


def _save_watch_capture() -> str:
    capture = recorded.recorded_capture()
    capture.capture_id = "20260101-000000-watch"
    doc = capture_json(capture)
    doc["tags"] = ["watch"]
    doc["watch"] = {"evidence": "/ev/x", "report": "/ev/x/report.md"}
    save_capture(capture, doc=doc)
    return capture.capture_id


async def test_the_stacks_screen_of_a_watch_capture_shows_its_tag_and_report() -> None:
    """Opened from the palette, a watch's capture says so on the screen's summary line,
    beside its coverage; a person's capture says nothing of the kind."""
    watch_id = _save_watch_capture()
    other = recorded.recorded_capture()
    other.capture_id = "20260101-000001-person"
    save_capture(other)
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(200, 40)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: len(app.saved_captures) == 2, what="the saved captures")
        opener = next(run for label, _, run in app._saved_capture_entries() if watch_id in label)
        await pilot.press("escape")
        opener()
        await until(pilot, lambda: isinstance(app.screen, StacksScreen)
                    and app.screen.analysis is not None, what="the watch capture")  # fmt: skip
        status = str(app.screen.query_one("#status", Static).render())
        assert "[watch] · report: /ev/x/report.md" in status, status
        assert f"capture {watch_id}" in status
        app.pop_screen()
        app.open_saved_capture(other.capture_id)
        await until(pilot, lambda: isinstance(app.screen, StacksScreen)
                    and app.screen.analysis is not None, what="the person's capture")  # fmt: skip
        status = str(app.screen.query_one("#status", Static).render())
        assert "capture 20260101-000001-person" in status and "[watch]" not in status, status


def test_stacks_open_of_a_watch_capture_names_its_tag_and_report() -> None:
    """`stacks --open` says what took the capture and where its report is, after its
    coverage lines; `--json` keeps the tag and the evidence, as the saved file has them."""
    watch_id = _save_watch_capture()
    text = run_cli("stacks", "--open", watch_id)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    coverage = next(i for i, line in enumerate(lines) if line.startswith("Coverage: "))
    assert "Taken by: [watch] · report: /ev/x/report.md" in lines[coverage + 1 : coverage + 3]
    doc = json.loads(run_cli("stacks", "--open", watch_id, "--json").stdout)
    assert doc["tags"] == ["watch"]
    assert doc["watch"] == {"evidence": "/ev/x", "report": "/ev/x/report.md"}
    person = recorded.recorded_capture()
    person.capture_id = "20260101-000001-person"
    save_capture(person)
    plain = run_cli("stacks", "--open", person.capture_id, "--json")
    assert "tags" not in json.loads(plain.stdout) and "Taken by" not in plain.stdout


def test_a_report_in_the_home_folder_is_shown_from_tilde() -> None:
    capture = recorded.recorded_capture()
    capture.tags, capture.watch_report = ("watch",), "/home/alice/ev/x/report.md"
    assert taken_by(capture, "/home/alice") == "[watch] · report: ~/ev/x/report.md"
    assert taken_by(capture, "/home/al") == "[watch] · report: /home/alice/ev/x/report.md"
    assert taken_by(capture, "/") == "[watch] · report: /home/alice/ev/x/report.md"
    capture.watch_report, capture.watch_evidence = None, "/home/alice/ev/x"
    assert taken_by(capture) == "[watch] · evidence: /home/alice/ev/x"
    capture.tags = ()
    assert taken_by(capture, "/home/alice") == ""
