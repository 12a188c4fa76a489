"""A DataTable with the keys vim, htop and k9s users reach for first: j/k, g/G."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

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


class VimTable(DataTable[Any]):
    """Every table in the console: arrows, page keys and j/k/g/G; a click highlights the
    row under the mouse (and so updates whatever shows the highlighted row)."""

    BINDINGS = VIM_BINDINGS

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

    async def _on_click(self, event: events.Click) -> None:
        before = self.cursor_coordinate
        await super()._on_click(event)
        if self.select_on_click and self.row_count and self.cursor_coordinate != before:
            self._post_selected_message()
