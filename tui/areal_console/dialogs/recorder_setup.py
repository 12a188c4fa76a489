"""How to turn the Flight Recorder on (`F` on the Stacks screen): the launch hook line and
the AReaL config block, selectable, and `c` copies it to the clipboard."""

from __future__ import annotations

from textual import events
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
        width: 96; max-width: 100%; height: auto; max-height: 100%; border: thick $accent;
        background: $surface; padding: 1 2;
    }
    RecorderSetupScreen TextArea { height: 18; }
    """
    # Columns around the block's text: the box's border and padding (6), the text area's
    # border and padding (4), its vertical scrollbar (2), the cursor's cell after the
    # longest line (1) and two spare.
    FRAME_WIDTH = 15
    # Rows that are not the text area's: the box's border and padding (4), the intro (up
    # to 2 rows), the hint (1) and the text area's own border (2).
    FRAME_HEIGHT = 9
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

    def on_resize(self, event: events.Resize) -> None:
        # Wide enough for the longest line where the terminal allows (at 160 columns the
        # export line no longer wraps), and never taller than the terminal: at 80x24 the
        # block scrolls inside its area while the hint stays in view.
        lines = self.block.splitlines() or [""]
        box = self.query_one(Vertical)
        box.styles.width = min(event.size.width, max(60, max(map(len, lines)) + self.FRAME_WIDTH))
        area = self.query_one(TextArea)
        area.styles.height = max(3, min(len(lines) + 2, event.size.height - self.FRAME_HEIGHT))

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.block)
        toast(self, "copied the Flight Recorder setup")

    def action_close(self) -> None:
        self.dismiss(None)
