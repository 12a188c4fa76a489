"""Navigation a cluster user expects: number keys, `:` commands, palette, keymap, themes."""

from __future__ import annotations

from areal_console.app import ConsoleApp
from areal_console.core.settings import Settings
from areal_console.screens.cluster import ClusterScreen
from areal_console.screens.command_line import CommandLine
from areal_console.widgets.process_table import ProcessTable
from recorded import recorded_monitor
from textual.command import CommandPalette
from textual.widgets import Input


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
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        assert screen.drilled == "node1" and screen.text_filter == "4103"
        table = screen.query_one(ProcessTable)
        assert [str(table.get_row_at(i)[4]) for i in range(table.row_count)] == ["4103"]


async def test_read_only_is_shown() -> None:
    app = ConsoleApp(None, recorded_monitor(), settings=Settings(read_only=True))
    async with app.run_test(size=(120, 36)):
        assert app.read_only and app.sub_title == "read-only"
