"""How to turn the Flight Recorder on (`F` on the Stacks screen): the launch hook line and
the AReaL config block, selectable, and `c` copies it to the clipboard."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from areal_console.toast import toast


class RecorderSetupScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    RecorderSetupScreen { align: center middle; }
    RecorderSetupScreen > Vertical {
        width: 96; height: auto; max-height: 90%; border: thick $accent;
        background: $surface; padding: 1 2;
    }
    RecorderSetupScreen TextArea { height: 18; }
    """
    BINDINGS = [
        Binding("c", "copy", "Copy", id="recorder_setup.copy",
                tooltip="Copy the block to the clipboard (OSC 52)"),
        Binding("escape,q", "close", "Close", id="recorder_setup.close",
                tooltip="Back to the stacks"),
    ]  # fmt: skip

    def __init__(self, block: str) -> None:
        super().__init__()
        self.block = block

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "No Flight Recorder trace came from this job. Start it with the launch hook "
                "(docs/guide/ledger.md); paste one of these:"
            )
            yield TextArea(self.block, read_only=True, id="setup-block")
            yield Static("c: copy   esc: close", classes="dim")

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.block)
        toast(self, "copied the Flight Recorder setup")

    def action_close(self) -> None:
        self.dismiss(None)
