"""Asks before loading a file whose pickle could run code (the `--trust-pickle` of the TUI)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from areal_console.widgets.remote_text import remote_text


class TrustPickleDialog(ModalScreen[bool]):
    """Dismisses with True only on an explicit yes; the default answer is no."""

    BINDINGS = [
        Binding(
            "y",
            "answer(True)",
            "Load anyway",
            id="trust-pickle.yes",
            tooltip="Load with pickle code allowed (only for files you trust)",
        ),
        Binding(
            "n,escape",
            "answer(False)",
            "Cancel",
            id="trust-pickle.no",
            tooltip="Do not load the file",
        ),
    ]

    def __init__(self, path: str, reason: str) -> None:
        super().__init__()
        self.path = path
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical(id="trust-dialog"):
            yield Static("Load a file that can run code?", id="trust-title")
            yield Static(remote_text(self.reason), id="trust-reason")
            yield Static(
                "Loading it unpickles arbitrary objects with this console's rights. "
                "Say yes only if you trust who wrote the file.",
                id="trust-detail",
            )
            with Horizontal(id="trust-buttons"):
                yield Button("No (n)", id="trust-no", variant="primary")
                yield Button("Yes, load it (y)", id="trust-yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#trust-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "trust-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
