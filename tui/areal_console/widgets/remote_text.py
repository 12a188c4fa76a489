"""The one way remote text reaches a widget: metric names from a run's log, group and op
names from a rank's trace, a job's log lines, command lines, frame names. Another user's
process or file wrote them, so every control character is shown as an escape
(`ESC` -> `\\x1b`) and nothing in them is read as markup: a log line can never retitle
the terminal, move the cursor or clear the screen."""

from __future__ import annotations

from rich.text import Text

from areal_console.core.common.textfmt import printable, strip_ansi


def remote_text(value: object, style: str = "") -> Text:
    """`value` as one line of text for a widget (a table cell, a label, a tree node)."""
    return Text(printable(value), style=style, no_wrap=False)


def remote_line(value: object) -> str:
    """`value` as one line for widgets that take plain strings (`Log`, plot labels)."""
    return printable(value)


def remote_block(value: object, style: str = "") -> Text:
    """`value` as several lines (a prompt, a completion): tabs and newlines kept, every
    other control character escaped."""
    return Text(printable(value, layout=True), style=style)


def remote_log_line(value: str) -> str:
    """A line of a log written for a terminal (AReaL's coloured `(AReaL)` lines): its
    colour codes dropped, not shown as `\\x1b[92m`; every other control character escaped."""
    return printable(strip_ansi(value))
