"""A DataTable with the keys vim, htop and k9s users reach for first: j/k, g/G."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.binding import Binding, BindingType
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

    # A click on another row selects it too (as enter would), so the pane that follows the
    # selection updates at once instead of on a second click. Off where selecting opens a
    # dialog.
    select_on_click = True

    async def _on_click(self, event: events.Click) -> None:
        before = self.cursor_coordinate
        await super()._on_click(event)
        if self.select_on_click and self.row_count and self.cursor_coordinate != before:
            self._post_selected_message()
