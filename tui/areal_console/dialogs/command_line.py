"""`:` command mode (k9s style): one line at the bottom; enter runs it, esc cancels."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input


class CommandLine(ModalScreen[str | None]):
    DEFAULT_CSS = """
    CommandLine { align: left bottom; background: transparent; }
    CommandLine > Input { width: 100%; margin-bottom: 1; border: tall $accent; }
    """
    BINDINGS = [
        Binding(
            "escape", "cancel", "Cancel", id="command.cancel", tooltip="Close the command line"
        ),
    ]

    def compose(self) -> ComposeResult:
        yield Input(placeholder=":nodes  :stacks  :batches  :jobs  :theme NAME  :q", id="command")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submit(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
