"""One line of state at the bottom of a screen: nodes up, ranks, freshness, filter."""

from __future__ import annotations

from textual.widgets import Static


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """

    _said: str | None = None

    def say(self, text: str) -> None:
        """Show `text`; the same text again costs nothing, and one line never re-lays out."""
        if text != self._said:
            self._said = text
            self.update(text, layout=False)
