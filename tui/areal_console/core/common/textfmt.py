"""Plain-text formatting shared by the CLI's readable output."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

# Characters a terminal acts on: C0 controls, DEL, C1 controls (8-bit CSI/OSC...), and
# the bidirectional overrides that reorder what the reader sees ("Trojan source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_LAYOUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# Terminal escape sequences a log's colours and cursor moves use (CSI: ESC [ ... letter).
_ANSI_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """`text` without its CSI escape sequences (colours, cursor moves): a log written for a
    terminal, read as text. What is left still goes through `printable`."""
    return _ANSI_CSI.sub("", text) if "\x1b" in text else text


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, layout: bool = False) -> str:
    """`text` safe to show in a terminal: every control character is written as an escape
    (`ESC` -> `\\x1b`), so remote text (command lines, frame names, file names, errors)
    can never move the cursor, retitle the window or clear the screen. With `layout`,
    tab and newline are kept (multi-line reports)."""
    value = text if isinstance(text, str) else str(text)
    pattern = _CONTROL_KEEP_LAYOUT if layout else _CONTROL
    return pattern.sub(_escape, value) if pattern.search(value) else value


def clip_repr(value: object, limit: int = 200) -> str:
    """`repr(value)` for an error message, cut to `limit` characters."""
    return clip(repr(value), limit)


# A command line is kept to this many characters (the rest said as a count): 200 processes
# with 1 MB command lines made `nodes --json` 197 MB and the TUI 860 MB. AReaL's longest
# (an rpc_server worker's, with its environment prefix) are a few KB.
MAX_CMDLINE = 16 << 10


def capped(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how many were cut: remote text that can be
    megabytes (a command line) kept at a size a screen or a JSON report can hold. Not
    escaped (JSON escapes; screens escape when they draw)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def clip(text: object, limit: int = 200) -> str:
    """`text` cut to `limit` characters for an error message (with how much was cut)."""
    value = printable(text)
    if len(value) <= limit:
        return value
    return f"{value[:limit]}… ({len(value) - limit} more characters)"


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 job`, `2 jobs` (`many` for irregular words: plural(n, "process", "processes"))."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def format_duration(seconds: float) -> str:
    """A wait in the unit a person would say it in: `95s`, `15 min`, `5 h`, `3 d`."""
    if round(seconds) < 120:
        return f"{seconds:.0f}s"
    if (minutes := round(seconds / 60)) < 120:
        return f"{minutes} min"
    if (hours := round(seconds / 3600)) < 48:
        return f"{hours} h"
    return f"{round(seconds / 86400):,} d"


def format_bytes(value: int | float | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(size) < 1024 or unit == "T":
            return f"{size:.0f}{unit}" if unit in ("B", "K") else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "   ") -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    rows = [[printable(cell) for cell in row] for row in rows]  # one cell, one line
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)


SPARK_CHARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, top: float = 100.0) -> str:
    """The last `width` values as block characters scaled to `top` (left-padded)."""
    tail = list(values)[-width:]
    chars = []
    for v in tail:
        level = max(0.0, min(1.0, v / top)) if top else 0.0
        chars.append(SPARK_CHARS[min(len(SPARK_CHARS) - 1, int(level * len(SPARK_CHARS)))])
    return " " * (width - len(chars)) + "".join(chars)


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar of `width` cells; empty cells shown as light shade."""
    if fraction is None:
        return "·" * width
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def rank_summary(ranks: Sequence[int]) -> str:
    """Compact rank ranges: [0, 1, 2, 3, 8] -> "0-3,8"."""
    out: list[str] = []
    values = sorted(set(ranks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


class PrintableStream:
    """A text stream that writes everything through `printable(..., layout=True)`.

    The CLI's commands write to it, so no remote string reaches the terminal raw,
    whichever print statement it travels through. JSON output is unchanged by it
    (`json.dumps` already escapes every control character).
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text, layout=True))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
