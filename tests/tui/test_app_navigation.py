"""Navigation a cluster user expects: number keys, `:` commands, palette, keymap, themes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.common.settings import Settings
from areal_console.core.targets.resolve import local_node
from areal_console.dialogs.command_line import CommandLine
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.cluster import ClusterScreen
from areal_console.screens.runs import RunsScreen
from areal_console.widgets.process_table import ProcessTable
from textual.command import CommandList, CommandPalette
from textual.widgets import Input

from tests.support import recorded
from tests.support.recorded import recorded_monitor
from tests.support.waits import until


async def test_colon_commands_switch_theme_and_report_unknown_words() -> None:
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(120, 36)) as pilot:
        assert app.theme == "textual-dark"
        await pilot.press("colon")
        assert isinstance(app.screen, CommandLine)
        await pilot.press(*"theme textual-light", "enter")
        assert app.theme == "textual-light"
        await pilot.press("colon", *"frobnicate", "enter")
        assert isinstance(app.screen, ClusterScreen)
        assert any("Unknown command 'frobnicate'" in n.message for n in app._notifications)
        await pilot.press("colon", "escape")
        assert isinstance(app.screen, ClusterScreen)
        await pilot.press("ctrl+t")
        assert app.theme == "textual-dark"


async def test_user_keymap_rebinds_by_binding_id() -> None:
    settings = Settings(keymap={"cluster.filter": "f"})
    app = ConsoleApp(None, recorded_monitor(), settings=settings)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("f")
        box = app.screen.query_one("#filter", Input)
        assert box.display and box.has_focus


async def test_palette_finds_a_rank_and_jumps_to_it() -> None:
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"Rank 2 on node1")
        hits = app.screen.query_one(CommandList)

        def first_hit() -> str:
            return str(hits.get_option_at_index(0).prompt) if hits.option_count else ""

        await until(pilot, lambda: "Rank 2 on node1" in first_hit(), what="the rank's hit")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ClusterScreen), what="the jump")
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        assert screen.drilled == "node1" and screen.text_filter == "4103"
        table = screen.query_one(ProcessTable)
        assert [str(table.get_row_at(i)[4]) for i in range(table.row_count)] == ["4103"]


async def test_read_only_is_shown_on_every_screen_and_in_help() -> None:
    """No screen has a title bar: the footer carries the mark, first (cut last at 80)."""
    app = ConsoleApp(None, recorded_monitor(), settings=Settings(read_only=True))
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.read_only
        for key in ("1", "4"):
            await pilot.press(key)
            await pilot.pause()
            bottom = app.screen._compositor.render_strips()[-1].text
            assert bottom.lstrip().startswith("read-only"), bottom
        await pilot.press("question_mark")
        await until(
            pilot,
            lambda: "read-only mode" in str(app.screen.query_one("#help-table").content.title),
        )


async def test_writable_console_has_no_read_only_mark() -> None:
    app = ConsoleApp(None, recorded_monitor(), settings=Settings(read_only=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "read-only" not in app.screen._compositor.render_strips()[-1].text


async def test_help_shows_the_binding_ids_a_keymap_names() -> None:
    """The keymap warning says the ids are listed with `?` (e.g. cluster.capture)."""
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.query("#help-table"))
        table = app.screen.query_one("#help-table").content
        ids = [str(cell) for cell in table.columns[3]._cells]
        assert table.columns[3].header == "ID" and "cluster.capture" in ids


async def test_reopened_batches_and_new_targets_build_fresh_screens(tmp_path: Path) -> None:
    """`:batches PATH` again (even while shown) and a new set of nodes replace the screens
    built before, through the app's own bookkeeping of its modes."""
    first, second = tmp_path / "a", tmp_path / "b"
    recorded.write_batches_dump(first)
    recorded.write_batches_dump(second)
    app = recorded.jobs_app()
    async with app.run_test(size=recorded.SIZE) as pilot:
        await pilot.press("4")
        await recorded.wait_until(pilot, lambda: isinstance(app.screen, RunsScreen))
        old_jobs = app.screen
        app.run_command(f"batches {first}")
        await recorded.wait_until(pilot, lambda: isinstance(app.screen, BatchesScreen))
        shown = app.screen
        assert isinstance(shown, BatchesScreen) and shown.path == str(first)
        app.run_command(f"batches {second}")  # while the first one is shown
        await recorded.wait_until(
            pilot, lambda: isinstance(app.screen, BatchesScreen) and app.screen is not shown
        )
        assert isinstance(app.screen, BatchesScreen) and app.screen.path == str(second)
        app.replace_targets([local_node()])
        assert app.current_mode == "nodes"
        await pilot.press("4")
        await recorded.wait_until(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert app.screen is not old_jobs
        assert isinstance(app.screen, RunsScreen) and app.screen.fleet is app.fleet


async def test_a_mistyped_path_keeps_the_open_batches_and_health_views(tmp_path: Path) -> None:
    from areal_console.core.metrics.locate import HealthTarget
    from areal_console.screens.health import HealthScreen

    from tests.support.areal_logfmt import write_run

    dump, run = tmp_path / "dump", tmp_path / "run"
    recorded.write_batches_dump(dump)
    run.mkdir()
    write_run(run, 3, finished=True)
    app = ConsoleApp(None, recorded_monitor(), batches_path=str(dump),
                     health_target=HealthTarget(str(run)))  # fmt: skip
    async with app.run_test(size=recorded.SIZE) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BatchesScreen))
        shown = app.screen
        app.run_command(f"batches {tmp_path / 'typo'}")
        await until(pilot, lambda: any("typo" in n.message for n in app._notifications))
        await pilot.pause()
        assert app.screen is shown and isinstance(shown, BatchesScreen)
        assert shown.path == str(dump) and app.batches_path == str(dump)
        note = next(n for n in app._notifications if "typo" in n.message)
        assert note.severity == "error" and "the open dump is kept" in note.message
        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, HealthScreen))
        health = app.screen
        app.run_command(f"health {tmp_path / 'tpyo'}")
        await pilot.pause()
        assert app.screen is health and app.health_target == HealthTarget(str(run))
        assert any("tpyo: no such file or directory (the open run is kept)" in n.message
                   for n in app._notifications)  # fmt: skip
        app.run_command(f"batches {dump}")  # a real path still replaces the view
        await until(
            pilot, lambda: isinstance(app.screen, BatchesScreen) and app.screen is not shown
        )


async def test_palette_lists_saved_captures_from_a_cache_read_off_the_ui_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import areal_console.app as app_module
    from areal_console.core.stacks.store import save_capture

    save_capture(recorded.recorded_capture())
    reads: list[str] = []
    real = app_module.list_captures

    def counting() -> list[Any]:
        reads.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(app_module, "list_captures", counting)
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(120, 36)) as pilot:
        ui_thread = threading.current_thread().name
        await pilot.press("ctrl+p")
        await recorded.wait_until(pilot, lambda: app.saved_captures)
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"Capture recorded")  # a search per keystroke, no disk read each
        await pilot.pause()
        labels = [label for label, _, _ in app._saved_capture_entries()]
        assert any(label.startswith("Capture recorded-cleanup_deadlock") for label in labels)
        assert len(reads) == 1 and ui_thread not in reads  # once per opening, in a worker
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await recorded.wait_until(pilot, lambda: len(reads) == 2)
