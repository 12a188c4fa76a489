"""The footer of every screen, with `? Help` first: on a narrow terminal the keys at the end
are cut, and `?` is the one that lists all the others."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer


class ConsoleFooter(Footer):
    def compose(self) -> ComposeResult:
        keys = list(super().compose())
        help_keys = [k for k in keys if getattr(k, "key", None) == "question_mark"]
        yield from help_keys + [k for k in keys if k not in help_keys]
