"""A yes/no question before anything destructive (k9s style: y confirms, n or esc cancels)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from areal_console.widgets.remote_text import remote_text


class ConfirmDialog(ModalScreen[bool]):
    """Dismisses with True on `y`, False on `n` or `esc`."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes", tooltip="Confirm and go ahead"),
        Binding("n", "answer(False)", "No", id="confirm.no", tooltip="Cancel"),
        Binding("escape", "answer(False)", "Cancel", id="confirm.cancel", tooltip="Cancel"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Label(remote_text(self.question), id="confirm-question")
            yield Label("y: yes · n/esc: no", id="confirm-hint")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
