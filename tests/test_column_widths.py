"""Columns follow what the tables show now: they shrink when long cells go, re-fit when the
terminal is resized, cut only the columns that may be cut, and never a status word."""

from __future__ import annotations

from pathlib import Path

import pytest
import recorded
from areal_console.widgets.vim_table import VimTable
from rich.text import Text
from textual.app import App, ComposeResult
from textual.render import measure
from textual.widgets.data_table import ColumnKey

LONG = "python -u /home/alice/areal/examples/math/gsm8k_grpo.py --config a-long-config.yaml"


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        table = VimTable()
        table.cut_columns = ("cmd",)
        yield table

    def on_mount(self) -> None:
        table = self.query_one(VimTable)
        table.add_column("STATE", key="state")
        table.add_column("COMMAND", key="cmd")


def width(table: VimTable, key: str) -> int:
    return table.columns[ColumnKey(key)].content_width


async def test_columns_shrink_with_their_content_and_refit_on_resize() -> None:
    app = TableApp()
    async with app.run_test(size=(160, 20)) as pilot:
        table = app.query_one(VimTable)
        table.add_row("verification failed", "python", key="a")
        table.add_row("ok", "python", key="b")
        await pilot.pause()
        assert width(table, "state") == len("verification failed")

        table.remove_row("a")  # the long cell goes: so does its width
        await pilot.pause()
        assert width(table, "state") == len("STATE")

        table.clear()
        table.add_row("running", "python", key="c")
        await pilot.pause()
        assert width(table, "state") == len("running")

        table.update_cell("c", "cmd", LONG, update_width=True)
        await pilot.pause()
        assert width(table, "cmd") == len(LONG)  # room at 160 columns: nothing cut

        await pilot.resize_terminal(60, 20)
        await pilot.pause()
        total = sum(c.get_render_width(table) for c in table.columns.values())
        assert total <= table.scrollable_content_region.width
        assert width(table, "state") == len("running")  # only the command is cut
        assert width(table, "cmd") < len(LONG)

        await pilot.resize_terminal(160, 20)
        await pilot.pause()
        assert width(table, "cmd") == len(LONG)


@pytest.mark.parametrize("size", [(160, 45), (80, 24)])
async def test_jobs_status_columns_are_never_cut(
    size: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    app = recorded.jobs_app()
    async with app.run_test(size=size) as pilot:
        await recorded.open_jobs(pilot)
        table = app.screen.query_one("#jobs-table", VimTable)
        for key in ("job", "state", "exit", "verification"):
            column = table.columns[ColumnKey(key)]
            cells = table.get_column(key)
            widest = max(measure(app.console, Text.from_markup(str(c)) if isinstance(c, str)
                                 else c, 1) for c in cells)  # fmt: skip
            assert widest <= column.get_render_width(table) - 2 * table.cell_padding, key
        if size[0] == 160:  # all of it on screen, no sideways scrolling
            assert table.virtual_size.width <= table.scrollable_content_region.width


CELLS = [
    "plain", "日本語の列", "[bold]marked up[/bold]", "an :smile: code", "two\nlines here",
    "tab\there", Text("a Text cell"), Text("a\nmulti-line Text"), 12345, 2.5, None, True, "",
]  # fmt: skip


class TwoTables(App[None]):
    def compose(self) -> ComposeResult:
        from textual.widgets import DataTable

        yield VimTable(id="ours")
        yield DataTable(id="textual")


async def test_fast_measuring_gives_textuals_widths() -> None:
    """VimTable measures plain one-line cells itself (Textual's per-cell measuring took
    1.5 s for 5,000 rows); every kind of cell must come out as wide as Textual makes it."""
    from textual.widgets import DataTable

    app = TwoTables()
    async with app.run_test(size=(200, 20)) as pilot:
        for table in app.query(DataTable):
            for i in range(len(CELLS)):
                table.add_column(f"c{i}", key=f"c{i}")
            for shift in range(len(CELLS)):  # every cell in every column
                table.add_row(*(CELLS[(i + shift) % len(CELLS)] for i in range(len(CELLS))))
            table.add_row(*(["x"] * len(CELLS)), label="a label")  # labelled: Textual's path
            table.add_row(*(["y"] * len(CELLS)), height=2)  # a tall row: Textual's path
        await pilot.pause()
        ours, theirs = app.query_one("#ours", VimTable), app.query_one("#textual", DataTable)
        assert [c.content_width for c in ours.ordered_columns] == [
            c.content_width for c in theirs.ordered_columns
        ]
        assert ours.virtual_size == theirs.virtual_size
        # and row by row: a table holding only one kind of cell
        for cell in CELLS:
            for table in (ours, theirs):
                table.clear(columns=True)
                table.add_column("only", key="only")
                table.add_row(cell)
            await pilot.pause()
            assert width(ours, "only") == theirs.columns[ColumnKey("only")].content_width, cell
