"""Plain-text formatting shared by the CLI's readable output."""

from __future__ import annotations

from collections.abc import Sequence


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 job`, `2 jobs` (`many` for irregular words: plural(n, "process", "processes"))."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


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
