"""A DataTable with the keys vim, htop and k9s users reach for first: j/k, g/G."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual._two_way_dict import TwoWayDict
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.render import measure
from textual.widgets import DataTable
from textual.widgets._data_table import default_cell_formatter
from textual.widgets.data_table import CellDoesNotExist, CellKey, Column, ColumnKey, Row, RowKey
from typing_extensions import Self

VIM_BINDINGS: list[BindingType] = [
    Binding("j", "cursor_down", "Down", show=False, id="table.down",
            tooltip="Next row (as the down arrow)"),
    Binding("k", "cursor_up", "Up", show=False, id="table.up",
            tooltip="Previous row (as the up arrow)"),
    Binding("g", "scroll_top", "First row", show=False, id="table.first",
            tooltip="First row (as ctrl+home)"),
    Binding("G", "scroll_bottom", "Last row", show=False, id="table.last",
            tooltip="Last row (as ctrl+end)"),
]  # fmt: skip


# Terminal columns under which tables leave out the columns they can best spare (each
# table names its own; what they hold is one key away, in a detail or a line below).
NARROW = 100


def columns_for(
    width: int,
    columns: Sequence[tuple[str, str]],
    spare: Sequence[str] = (),
    short_labels: dict[str, str] | None = None,
) -> tuple[tuple[str, str], ...]:
    """(key, label) of the `columns` to show on a terminal `width` cells wide: all of them,
    or under NARROW those not in `spare`, with their `short_labels`."""
    if width >= NARROW:
        return tuple(columns)
    short = short_labels or {}
    return tuple((key, short.get(key, label)) for key, label in columns if key not in spare)


class VimTable(DataTable[Any]):
    """Every table in the console: arrows, page keys and j/k/g/G; a click highlights the
    row under the mouse (and so updates whatever shows the highlighted row)."""

    BINDINGS = VIM_BINDINGS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # cell -> its width when its column was last measured, for cells changed since
        self._old_widths: dict[CellKey, int] = {}

    # What a row is, in the line that says why a cursor key did not move ("group", "job").
    row_noun = "row"

    class AtEdge(Message):
        """A cursor key could not move the row cursor; `text` says why, for a status line.
        Screens with a status line show it there; elsewhere the app shows a notification."""

        def __init__(self, table: VimTable, text: str) -> None:
            super().__init__()
            self.table, self.text = table, text

    def _moved_or_say(self, before: int, towards_top: bool) -> None:
        if self.cursor_type != "row" or not self.show_cursor or self.cursor_row != before:
            return
        noun = self.row_noun
        if self.row_count == 0:
            text = f"no {noun}s to move between"
        else:
            text = f"already at the {'first' if towards_top else 'last'} {noun}"
            if self.row_count == 1:
                text += " (the only one)"
        self.post_message(self.AtEdge(self, text))

    def action_cursor_down(self) -> None:
        before = self.cursor_row
        super().action_cursor_down()
        self._moved_or_say(before, towards_top=False)

    def action_cursor_up(self) -> None:
        before = self.cursor_row
        super().action_cursor_up()
        self._moved_or_say(before, towards_top=True)

    def action_scroll_top(self) -> None:
        before = self.cursor_row
        super().action_scroll_top()
        self._moved_or_say(before, towards_top=True)

    def action_scroll_bottom(self) -> None:
        before = self.cursor_row
        super().action_scroll_bottom()
        self._moved_or_say(before, towards_top=False)

    # A click on another row selects it too (as enter would), so the pane that follows the
    # selection updates at once instead of on a second click. Off where selecting opens a
    # dialog.
    select_on_click = True

    # Columns (keys) that may be cut, first to last, when the table is narrower than its
    # content; the full text of a cut cell is one key away (enter). None by default: a
    # table too wide scrolls sideways.
    cut_columns: tuple[str, ...] = ()
    # Of those, the ones whose end tells rows apart (a job id's `-HHMMSS-hex`): the number of
    # last characters to keep when cut, the ellipsis before them. Others lose their end.
    cut_tails: dict[str, int] = {}  # set whole per table, never mutated
    shown_columns: tuple[tuple[str, str], ...] = ()  # (key, label) as set by show_columns

    def show_columns(self, columns: Sequence[tuple[str, str]]) -> bool:
        """Make the table's columns `columns` ((key, label), in order); when they change the
        rows are cleared (the caller adds them again). Whether they changed."""
        wanted = tuple(columns)
        if wanted == self.shown_columns:
            return False
        self.shown_columns = wanted
        self.clear(columns=True)
        for key, label in wanted:
            self.add_column(label, key=key)
        return True

    @property
    def column_keys(self) -> list[str]:
        return [key for key, _ in self.shown_columns]

    _drawn_widths: tuple[int, ...] = ()

    async def _on_click(self, event: events.Click) -> None:
        before = self.cursor_coordinate
        await super()._on_click(event)
        if self.select_on_click and self.row_count and self.cursor_coordinate != before:
            self._post_selected_message()

    # Columns sized from the content (auto width) follow it both ways: Textual only ever
    # widens them as cells arrive, so after `clear()` or a removed row the widths of rows
    # long gone would stay. Both reset the auto-width columns to their labels and queue
    # every remaining row for measuring, as new rows are, on the next idle.

    def clear(self, columns: bool = False) -> Self:
        super().clear(columns)
        self._old_widths.clear()
        self._refit_columns()
        return self

    def remove_row(self, row_key: RowKey | str) -> None:
        super().remove_row(row_key)
        self._refit_columns()

    def remove_rows(self, keys: Iterable[str]) -> None:
        """`remove_row` for each of `keys`, in one pass over the rows left and one refit.
        Textual's `remove_row` numbers every remaining row again: a filter that hid 4,000
        of 4,096 rows one by one took seconds."""
        gone = {RowKey(key) for key in keys if key in self.rows}
        if len(gone) <= 1:
            for key in gone:
                self.remove_row(key)
            return
        kept = [row.key for row in self.ordered_rows if row.key not in gone]
        for key in gone:
            for column_key in self._data[key]:
                self._updated_cells.discard(CellKey(key, column_key))
            del self.rows[key]
            del self._data[key]
        self._row_locations = TwoWayDict({key: index for index, key in enumerate(kept)})
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate  # kept inside the table
        self.hover_coordinate = self.hover_coordinate
        self._update_count += 1
        self._refit_columns()

    def on_resize(self) -> None:
        self._refit_columns()
        self.rows_came_into_view()

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        # Textual measures every cell of every new row through Rich (~30 us a cell: 1.5 s
        # for a dump's 5,000 samples). One-line rows of plain cells are measured here by
        # their cell length, which is what Rich's measure returns for them; the rest (labels,
        # tall rows, cells that could hold markup, emoji codes or line breaks) go to Textual.
        by_textual: list[RowKey] = []
        columns = self.ordered_columns
        for row_key in new_rows:
            row = self.rows.get(row_key)
            if row is None or row_key not in self._row_locations:
                continue  # removed before the idle that measures it
            widths = _plain_widths(self._data[row_key], columns) if row.height == 1 else None
            if widths is None or row.label is not None:
                by_textual.append(row_key)
                continue
            for column, width in zip(columns, widths, strict=True):
                if width > column.content_width:
                    column.content_width = width
        super()._update_dimensions(by_textual)
        self._fit_width()
        drawn = tuple(c.get_render_width(self) for c in self.columns.values())
        if drawn != self._drawn_widths:  # cells drawn at the old widths are stale
            self._drawn_widths = drawn
            self._clear_caches()

    def update_cell(
        self,
        row_key: RowKey | str,
        column_key: ColumnKey | str,
        value: Any,
        *,
        update_width: bool = False,
    ) -> None:
        if update_width:  # a cell as wide as the one it replaces leaves its column as it is
            # (Textual's keys hash and compare as their strings: no key objects needed)
            cells = self._data.get(row_key)  # type: ignore[arg-type]
            if cells is not None and column_key in cells:
                old = cells[column_key]  # type: ignore[index]
                update_width = self._width_differs(row_key, old, value)
                if update_width:
                    self._note_old_width(str(row_key), str(column_key), old)
        super().update_cell(row_key, column_key, value, update_width=update_width)

    def update_cells(self, changes: Iterable[tuple[str, str, Any]]) -> None:
        """`update_cell(row, column, value, update_width=True)` for each change, with one
        repaint for all of them (a repaint per cell is most of what a cell update costs:
        at 1,000 processes, a third of a 1 Hz refresh), and only the changed cells drawn
        again (`_forget_renders`)."""
        data = self._data
        changed: set[tuple[str, str]] = set()
        for row_key, column_key, value in changes:
            cells = data.get(row_key)  # type: ignore[call-overload]
            if cells is None or column_key not in cells:
                raise CellDoesNotExist(
                    f"No cell exists for row_key={row_key!r}, column_key={column_key!r}."
                )
            old = cells[column_key]
            cells[column_key] = value  # the key objects in the dict stay as they are
            changed.add((row_key, column_key))
            if self._width_differs(row_key, old, value):
                self._note_old_width(row_key, column_key, old)
                self._updated_cells.add(CellKey(RowKey(row_key), ColumnKey(column_key)))
                self._require_update_dimensions = True
        if changed:
            self._forget_renders(changed)
            self.refresh()

    def _forget_renders(self, cells: set[tuple[str, str]]) -> None:
        """Drop what Textual has cached of `cells` (row key, column key) drawn, and the
        lines holding them; every other cell's drawing stays cached. Textual keys all its
        caches by one count that every update moves: a 1 Hz refresh that changes each
        rank's CPU% drew every cell on screen again (11 columns, through Rich), and
        walked every row to rebuild the row order (4,096 rows, whatever is on screen).
        Only cells change here: rows keep their order and height, so those caches hold;
        a column whose width changes clears them all (`_update_dimensions`)."""
        cache = self._cell_render_cache
        cached = cache.keys()  # an LRUCache is no iterable itself
        for key in [key for key in cached if (key[0], key[1]) in cells]:
            cache.discard(key)
        self._row_render_cache.clear()
        self._row_renderable_cache.clear()
        self._line_cache.clear()

    # Rows in view. Tables of thousands of rows (4,096 ranks) update the cells of the rows
    # on screen only; rows that scroll into view, or come into it when the table grows,
    # are brought up to date then (`rows_came_into_view`).

    def keys_in_view(self) -> list[str]:
        """Keys of the rows on screen now, top to bottom (none before the first layout)."""
        height = self.scrollable_content_region.height
        if self.show_header:
            height -= self.header_height
        if height <= 0:
            return []
        top = int(self.scroll_y)
        keys: list[str] = []
        for row_key, _ in self._y_offsets[top : top + height]:
            value = row_key.value
            if value is not None and (not keys or keys[-1] != value):
                keys.append(value)
        return keys

    def rows_came_into_view(self) -> None:
        """Called when other rows may be on screen (scrolled, resized, re-sorted): tables
        that update only the rows in view bring these up to date."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if int(old_value) != int(new_value):
            self.rows_came_into_view()

    def _note_old_width(self, row_key: str, column_key: str, old: object) -> None:
        """Remember how wide a cell was when its column was last measured (its first
        change since), so that a cell narrower than its column's widest changes nothing."""
        cell = CellKey(RowKey(row_key), ColumnKey(column_key))
        if cell not in self._old_widths:
            row = self.rows.get(RowKey(row_key))
            if row is not None:
                self._old_widths[cell] = self._cell_width(row, old)

    def _width_differs(self, row_key: RowKey | str, old: object, new: object) -> bool:
        """Whether replacing `old` by `new` in that row can change its column's width."""
        width = _plain_width(old)
        if width is not None and width == _plain_width(new):
            return False
        row = self.rows.get(row_key)  # type: ignore[arg-type]
        return row is not None and self._cell_width(row, old) != self._cell_width(row, new)

    def _update_column_widths(self, updated_cells: set[CellKey]) -> None:
        # Textual re-measures a whole column for every updated cell that got narrower:
        # rows x updated cells measures a tick (at 1,000 processes, seconds a refresh).
        # Here each changed cell is measured once, and a column with a narrower cell is
        # re-measured once, after all of them.
        # A cell narrower than its column that was narrower before too changes nothing
        # (the column's widest cell is another): only one that was as wide as the column
        # can make it narrower.
        narrower: set[ColumnKey] = set()
        old_widths = self._old_widths
        for cell_key in updated_cells:
            row_key, column_key = cell_key
            column = self.columns.get(column_key)
            row = self.rows.get(row_key)
            if column is None or row is None:
                continue
            width = self._cell_width(row, self._data[row_key][column_key])
            if width >= column.content_width:
                column.content_width = max(width, self._label_width(column))
            elif old_widths.get(cell_key, column.content_width) >= column.content_width:
                narrower.add(column_key)
        old_widths.clear()
        for column_key in narrower:
            column = self.columns[column_key]
            widths = (
                self._cell_width(self.rows[row_key], cells.get(column_key))
                for row_key, cells in self._data.items()
                if row_key in self.rows
            )
            column.content_width = max([self._label_width(column), *widths])
        self._require_update_dimensions = True

    def _label_width(self, column: Column) -> int:
        return measure(self.app.console, column.label, 1)

    def _cell_width(self, row: Row, value: object) -> int:
        """The width Textual measures for `value` in `row`."""
        width = _plain_width(value) if row.height == 1 else None
        if width is not None:
            return width
        renderable = default_cell_formatter(value, wrap=row.height != 1, height=row.height)
        return measure(self.app.console, renderable, 1)

    def _fit_width(self) -> None:
        """Narrow the `cut_columns` (in that order, to no less than their label or 8
        cells) while the columns are wider than the table; the rest are never cut."""
        width = self.scrollable_content_region.width
        if not self.cut_columns or width <= 0:
            return
        total = sum(c.get_render_width(self) for c in self.columns.values())
        excess = total + self._row_label_column_width - width
        for key in self.cut_columns:
            column = self.columns.get(ColumnKey(key))
            if excess <= 0 or column is None or not column.auto_width:
                continue
            floor = max(self._label_width(column), 8)
            take = max(0, min(excess, column.content_width - floor))
            column.content_width -= take
            excess -= take
        widths = tuple(c.get_render_width(self) for c in self.columns.values())
        self.virtual_size = Size(
            sum(widths) + self._row_label_column_width, self.virtual_size.height
        )

    def _compute_row_renderables(self, row_index: int) -> Any:
        """Textual's cells, with a cut `cut_tails` cell's end kept (Textual crops the end)."""
        renderables = super()._compute_row_renderables(row_index)
        if row_index < 0 or not self.cut_tails:
            return renderables
        cells = renderables.cells
        for index, column in enumerate(self.ordered_columns):
            tail = self.cut_tails.get(str(column.key.value))
            cell = cells[index] if index < len(cells) else None
            if tail is not None and isinstance(cell, Text):
                cells[index] = cut_keeping_tail(cell, column.content_width, tail)
        return renderables

    def _refit_columns(self) -> None:
        for column in self.columns.values():
            if column.auto_width:
                column.content_width = self._label_width(column)
        self._new_rows.update(self.rows)
        self._require_update_dimensions = True
        self.refresh(layout=True)
        self.check_idle()


# Characters that make a string cell more than its plain text to Textual: markup, emoji
# codes, line breaks and tabs.
_NOT_PLAIN = re.compile("[\\[:\n\r\t]")


def _plain_width(value: object) -> int | None:
    """The width Textual would measure for a cell of a one-line row, when it is plain text;
    None when only Textual can tell."""
    if value is None:
        return 0
    if isinstance(value, str):
        return None if _NOT_PLAIN.search(value) else cell_len(value)
    if isinstance(value, Text):
        return None if "\n" in value.plain or "\t" in value.plain else value.cell_len
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return len(str(value))
    if isinstance(value, float):
        return len(f"{value:.2f}")
    return None


def _plain_widths(cells: dict[ColumnKey, Any], columns: list[Column]) -> list[int] | None:
    widths = []
    for column in columns:
        width = _plain_width(cells.get(column.key))
        if width is None:
            return None
        widths.append(width)
    return widths


def cut_keeping_tail(text: Text, width: int, tail: int) -> Text:
    """`text` in `width` cells: whole when it fits, else its last `tail` characters (fewer
    when even they do not fit) after an ellipsis, its start before that as room allows.
    Text with wide characters is left to Textual's cut."""
    plain = text.plain
    if width < 2 or len(plain) <= width or cell_len(plain) != len(plain) or "\n" in plain:
        return text
    keep = min(tail, width - 1)
    head = width - 1 - keep
    return Text.assemble(text[:head], "…", text[len(plain) - keep :])
