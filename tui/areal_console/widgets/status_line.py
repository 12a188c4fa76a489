"""One line of state at the bottom of a screen: nodes up, ranks, freshness, filter."""

from __future__ import annotations

from textual.widgets import Static


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """

    def say(self, text: str) -> None:
        self.update(text)
