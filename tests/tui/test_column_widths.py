"""Columns follow what the tables show now: they shrink when long cells go, re-fit when the
terminal is resized, cut only the columns that may be cut, and never a status word."""

from __future__ import annotations

from pathlib import Path

import pytest
from areal_console.widgets.vim_table import VimTable
from rich.text import Text
from textual.app import App, ComposeResult
from textual.render import measure
from textual.widgets.data_table import ColumnKey

from tests.support import recorded

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
        # Under 100 columns the exit column gives way (the detail line names the exit code).
        shown = (
            ("job", "state", "exit", "verification")
            if size[0] >= 100
            else ("job", "state", "verification")
        )
        for key in shown:
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


async def test_updated_cells_size_columns_as_textual_does_without_a_pass_per_cell() -> None:
    """`update_cell(..., update_width=True)` on every row: the same widths as a plain
    DataTable, but a column is measured again once per refresh, not once per cell (at
    1,024 process rows Textual's own pass measured a million cells a tick)."""
    import textual.widgets._data_table as data_table
    from textual.widgets import DataTable

    class Both(App[None]):
        def compose(self) -> ComposeResult:
            yield VimTable(id="vim")
            yield DataTable(id="plain")

    rows = 40
    before = {"cpu": ["100", *["7"] * (rows - 1)], "state": ["ok"] * rows, "cmd": [LONG] * rows}
    after = {  # the widest CPU cell narrows; a state cell grows; every command narrows
        "cpu": [str(i % 10) for i in range(rows)],
        "state": ["running", Text("verification failed"), *["ok"] * (rows - 2)],
        "cmd": ["python"] * rows,
    }
    app = Both()
    async with app.run_test(size=(200, 60)) as pilot:
        vim, plain = app.query_one("#vim", VimTable), app.query_one("#plain", DataTable)
        for table in (vim, plain):
            for key in before:
                table.add_column(key.upper(), key=key)
            for i in range(rows):
                table.add_row(*(before[key][i] for key in before), key=str(i))
        await pilot.pause()

        calls = {"vim": 0, "plain": 0}
        counted = ["vim"]  # whose refresh is being counted
        real = measure

        def counting(*args: object, **kwargs: object) -> int:
            calls[counted[0]] += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        import areal_console.widgets.vim_table as vim_table

        vim_table.measure = data_table.measure = counting  # type: ignore[assignment]
        try:
            for name, table in (("vim", vim), ("plain", plain)):
                counted[0] = name
                for key, values in after.items():
                    for i, value in enumerate(values):
                        table.update_cell(str(i), key, value, update_width=True)
                await pilot.pause()
        finally:
            vim_table.measure = data_table.measure = real  # type: ignore[assignment]
        got = {key: width(vim, key) for key in after}
        want = {key: plain.columns[ColumnKey(key)].content_width for key in after}
        assert got == want == {"cpu": 3, "state": len("verification failed"), "cmd": 6}
        assert calls["plain"] > rows * rows  # Textual: the whole column per narrowed cell
        assert calls["vim"] <= rows * len(after)  # here: at most once per updated cell


async def test_update_cells_is_update_cell_for_each_with_one_repaint() -> None:
    """`update_cells` leaves the table as `update_cell(..., update_width=True)` for each
    change would (cells, column widths, what is drawn), asking for one repaint, not one
    per cell; a change to a cell that does not exist is refused."""
    from textual.widgets.data_table import CellDoesNotExist

    class Both(App[None]):
        def compose(self) -> ComposeResult:
            yield VimTable(id="one")
            yield VimTable(id="many")

    rows = 30
    async with Both().run_test(size=(200, 80)) as pilot:
        one, many = pilot.app.query_one("#one", VimTable), pilot.app.query_one("#many", VimTable)
        for table in (one, many):
            table.add_column("%", key="cpu")
            table.add_column("COMMAND", key="cmd")
            for i in range(rows):
                table.add_row("100" if i == 0 else "7", LONG, key=str(i))
        await pilot.pause()
        assert width(many, "cpu") == 3
        changes = [(str(i), "cpu", str(i % 10)) for i in range(rows)]
        changes += [("3", "cmd", "python"), ("4", "cmd", Text("a [b] styled cell"))]
        for row, column, value in changes:
            one.update_cell(row, column, value, update_width=True)
        repaints = []
        real_refresh = many.refresh
        many.refresh = lambda *a, **k: repaints.append(1) or real_refresh(*a, **k)  # type: ignore[method-assign]
        many.update_cells(changes)
        assert len(repaints) == 1
        await pilot.pause()
        for key in ("cpu", "cmd"):
            assert width(many, key) == width(one, key)
        assert width(many, "cpu") == 1  # the 100 went: the column narrowed to its cells
        assert [many.get_row_at(i) for i in range(rows)] == [one.get_row_at(i) for i in range(rows)]
        lines = [many.render_line(y).text for y in range(rows)]
        assert lines == [one.render_line(y).text for y in range(rows)]
        with pytest.raises(CellDoesNotExist):
            many.update_cells([("no-such-row", "cpu", "1")])
