"""Driving one screen on its own under Pilot: `ScreenHost` shows it with the console's
stylesheet and keeps what it is dismissed with; `select_run` puts the Runs screen's
cursor on one run and waits until the screen has it selected (its detail, `v`, `s` and
`r` act on that run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_console.styles import STYLESHEET
from textual.app import App
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import DataTable
from textual.widgets._toast import Toast

from tests.support.waits import until

PENDING = "pending"  # `ScreenHost.result` until the screen is dismissed
ScreenOrFactory = Screen[Any] | Callable[[], Screen[Any]]


class ScreenHost(App[None]):
    """An app whose first screen is `screen` (or the one `screen()` makes, once the app
    runs); `results` holds every value it was dismissed with, `result` the last one."""

    CSS_PATH = STYLESHEET

    def __init__(self, screen: ScreenOrFactory) -> None:
        super().__init__()
        self._first = screen
        self.results: list[Any] = []

    @property
    def result(self) -> Any:
        return self.results[-1] if self.results else PENDING

    def on_mount(self) -> None:
        first = self._first if isinstance(self._first, Screen) else self._first()
        self.push_screen(first, self.results.append)


def toasts(app: App[Any]) -> list[str]:
    """The text of every toast on screen, as drawn."""
    return [str(t.render()) for t in app.screen.query(Toast)]


async def select_run(pilot: Pilot[Any], key: str, timeout: float = 30.0) -> DataTable[Any]:
    """Wait for the run `key` ("node/job id") in the Runs screen's table, move the cursor
    to it, and wait until the screen has it selected; the table."""
    screen: Any = pilot.app.screen
    table = screen.query_one("#jobs-table", DataTable)
    await until(pilot, lambda: key in table.rows, timeout, what=f"the run {key}")
    table.move_cursor(row=table.get_row_index(key))
    await until(pilot, lambda: screen.selected == key, timeout, what=f"{key} selected")
    return table
