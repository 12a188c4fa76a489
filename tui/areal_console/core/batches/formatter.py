"""How batch figures read, the same in `areal-console batch` and on the Batches screen.

One rule for every figure of a batch summary, its statistics, samples and comparisons:
unknown is `-`, counts carry thousands separators, measured values (floats) show a fixed
number of decimals (so 1.0 and 0.0 read as `1.000` and `0.000` in a column of rewards,
never `1` and `0`), and file sizes use the console's binary units (`format_bytes`).
"""

from __future__ import annotations

from typing import Any

from areal_console.core.common.textfmt import format_bytes

__all__ = ["figure", "figure_as", "size"]


def figure(value: Any, digits: int = 1) -> str:
    """A count or a measured value: `-` when unknown; floats to `digits` decimals."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figure_as(value: float | None, spec: str) -> str:
    """A value in an explicit format (`.0%`, `.3f`, `g`), `-` when unknown."""
    return "-" if value is None else format(value, spec)


def size(n: int | None) -> str:
    """A file's size, in the units every size in the console uses."""
    return format_bytes(n)
