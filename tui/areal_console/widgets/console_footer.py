"""The footer of every screen, with `? Help` first and `q Quit` second: on a narrow terminal
the keys at the end are cut, `?` is the one that lists all the others, and `q` is the one a
newcomer looks for to leave."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Label


class ConsoleFooter(Footer):
    """With `--read-only`, a `read-only` mark first (no screen has a title bar)."""

    DEFAULT_CSS = """
    ConsoleFooter .read-only-mark {
        width: auto;
        padding: 0 1;
        background: $warning;
        color: $text;
        text-style: bold;
    }
    """
    _shown: tuple[Any, ...] | None = None  # the bindings the footer's keys were made from

    def compose(self) -> ComposeResult:
        self._shown = self._bindings_shown() if self._bindings_ready else None
        keys = list(super().compose())
        help_keys = [k for k in keys if getattr(k, "key", None) == "question_mark"]
        quit_keys = [k for k in keys if str(getattr(k, "action", "")).endswith("quit")]
        first = help_keys + quit_keys
        if getattr(self.app, "read_only", False):
            yield Label("read-only", classes="read-only-mark")
        yield from first + [k for k in keys if k not in first]

    def bindings_changed(self, screen: Screen[Any]) -> None:
        # Textual rebuilds every key of the footer whenever the bindings may have changed
        # (each screen switch, each focus move): about 50 widgets styled anew, 50 ms of the
        # UI thread on the Stacks screen. Rebuilt here only when the keys shown differ.
        if (
            self._shown is not None
            and self.is_attached
            and screen is self.screen
            and self._bindings_shown() == self._shown
        ):
            return
        super().bindings_changed(screen)

    def _bindings_shown(self) -> tuple[Any, ...] | None:
        if not self.is_attached:
            return None
        return tuple(
            (binding.key, binding.action, binding.description, enabled, tooltip)
            for (_, binding, enabled, tooltip) in self.screen.active_bindings.values()
            if binding.show or binding.action == "command_palette"
        )
