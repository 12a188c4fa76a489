"""`?`: every key of the current screen, with what it does."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static

# Keys with no printable character, by the name a keyboard shows.
KEY_NAMES = {
    "escape": "esc",
    "pageup": "pgup",
    "pagedown": "pgdn",
    "delete": "del",
    "backspace": "backspace",
    "enter": "enter",
    "tab": "tab",
    "space": "space",
    "up": "↑",
    "down": "↓",
    "left": "←",
    "right": "→",
}


def key_label(key: str) -> str:
    """The keys a user presses for a binding's key string (`number_sign` is `#`,
    `ctrl+left_square_bracket` is `ctrl+[`), comma-separated alternatives joined."""
    return ", ".join(_one_key(k.strip()) for k in key.split(",") if k.strip())


def _one_key(key: str) -> str:
    *modifiers, name = key.split("+") if key != "+" else [key]
    if name in KEY_NAMES:
        shown = KEY_NAMES[name]
    else:  # a character by its Unicode name (`number_sign`), or a named key (`f5`)
        shown = format_key(name)
    return "+".join([*modifiers, shown])


# One row: the key, what it is called, what it does, and its id (what a `keymap:` in the
# settings names to rebind it; "" for a widget's own keys, which cannot be rebound).
HelpRow = tuple[str, str, str, str]


def render_help(title: str, bindings: list[HelpRow]) -> Table:
    table = Table(
        title=title,
        caption="ID: rebind a key with `keymap: {ID: KEY}` in the settings (docs/guide/guide.md)",
        box=None,
        expand=True,
        show_header=True,
        padding=(0, 2),
    )
    table.add_column("KEY", style="bold cyan", no_wrap=True)
    table.add_column("ACTION", no_wrap=True)
    table.add_column("WHAT IT DOES", style="dim")
    table.add_column("ID", style="green", no_wrap=True)
    for key, description, tooltip, binding_id in bindings:
        table.add_row(key_label(key), description, Text(tooltip), binding_id)
    return table


class HelpScreen(ModalScreen[None]):
    """A modal list of keys; any of esc, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 150; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 1 2;
    }
    """
    BINDINGS = [
        Binding(
            "escape,q,question_mark", "dismiss", "Close", id="help.close", tooltip="Close this help"
        ),
    ]

    def __init__(self, title: str, bindings: list[HelpRow]) -> None:
        super().__init__()
        self.help_title = title
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(render_help(self.help_title, self.bindings), id="help-table")
