"""The last RSS readings of a node's processes side by side, for the live verdicts: the
sparklines and the growth pre-check of thousands of processes in a few array operations
instead of a Python loop over each (core/connection/sampling.py keeps the series).

A node's block starts when its processes change (a new layout) and takes one row per
steady sample: the RSS of each process that has a series, in layout order. The rows are
the series' newest readings: they go into the series themselves (`flush`) only before the
ring would overwrite them or when a series is read, so a steady sample costs one row, not
an append per process. A block stands for its series while every one of them took every
reading (`whole`); a reading that cannot go in (not an int) ends that until the next
layout, and the series take their readings one by one again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 32  # rows kept: at least the growth window and the sparkline's width
_DIGITS = ord("0")


class NodeBlock:
    """One node's last WINDOW samples of its processes' RSS (bytes), a column a process
    (`series`: each column's series of (time, bytes) readings)."""

    __slots__ = ("count", "flushed", "series", "times", "values", "whole")

    def __init__(self, series: list[deque[tuple[float, int]]]) -> None:
        self.series = series
        self.times = np.zeros(WINDOW)
        self.values = np.zeros((WINDOW, len(series)), dtype=np.int64)
        self.count = 0  # rows taken since the block started
        self.flushed = 0  # of which in the series already
        self.whole = True

    def add(self, at: float, readings: list[int]) -> bool:
        """Take one sample's readings (ints, one a column); False when they cannot go in
        (the block is no longer whole then, and its rows are in the series)."""
        if self.count - self.flushed == WINDOW:
            self.flush()
        row = self.count % WINDOW
        try:
            self.values[row] = readings
        except (OverflowError, ValueError):  # beyond an int64, or a column short
            self.flush()
            self.whole = False
            return False
        self.times[row] = at
        self.count += 1
        return True

    def flush(self) -> None:
        """Append the rows not yet in the series to them, in order."""
        waiting = self.count - self.flushed
        if waiting <= 0:
            return
        rows = [(self.flushed + i) % WINDOW for i in range(waiting)]
        times = self.times[rows].tolist()
        for series, column in zip(self.series, self.values[rows].T.tolist(), strict=True):
            series.extend(zip(times, column, strict=True))
        self.flushed = self.count


# What the growth check reads of a window: its first and last readings (time, bytes), the
# sums of t, y, t*t and t*y (t from the first reading, summed in reading order), and how
# many readings rose.
WindowSums = tuple[tuple[float, float], tuple[float, float], tuple[float, float, float, float], int]


@dataclass(frozen=True, slots=True)
class BlockVerdicts:
    """Per column of one block: its sparkline, and its window's sums where the growth
    check must look (None: it gained too little to be growth)."""

    sparks: list[str]
    candidates: list[WindowSums | None]


def block_verdicts(
    blocks: Sequence[NodeBlock], width: int, window: int, least: float, sparks: str
) -> list[BlockVerdicts]:
    """For blocks of at least `window` rows (`window` <= WINDOW): each column's sparkline
    of its last `width` readings (the levels `sparks`, lowest first, scaled between the
    readings' least and greatest; all the lowest where they are equal), and whether it
    gained at least `least` bytes a minute from the window's first reading to its last
    (what the growth check asks at least), with that window's sums for the check. The same
    arithmetic, in the same order, as a process's own series gives in Python (int64
    readings below 2**53 convert exactly; `cumsum` adds in order, as a loop does)."""
    out: dict[int, BlockVerdicts] = {}
    by_columns: dict[int, list[int]] = {}
    for i, block in enumerate(blocks):
        by_columns.setdefault(block.values.shape[1], []).append(i)
    top = len(sparks) - 1
    table = {_DIGITS + level: char for level, char in enumerate(sparks)}
    for columns, members in by_columns.items():
        group = [blocks[i] for i in members]
        values = np.stack([b.values for b in group])  # (blocks, WINDOW, columns)
        times = np.stack([b.times for b in group])  # (blocks, WINDOW)
        counts = np.array([b.count for b in group])
        rows = np.arange(len(group))[:, None]
        tail = values[rows, (counts[:, None] - width + np.arange(width)) % WINDOW]
        lo, hi = tail.min(axis=1, keepdims=True), tail.max(axis=1, keepdims=True)
        span = np.where(hi == lo, 1, hi - lo)
        levels = np.rint((tail - lo) / span * top)  # half to even, as round()
        # In [0, top] for readings below 2**53; clipped where a hostile agent's would wrap.
        levels = np.clip(np.nan_to_num(levels), 0, top).astype(np.uint8)
        text = (levels.transpose(0, 2, 1) + _DIGITS).tobytes().decode("ascii").translate(table)
        first, last = (counts - window) % WINDOW, (counts - 1) % WINDOW
        flat = rows[:, 0]
        r0, r1 = values[flat, first], values[flat, last]  # (blocks, columns)
        t0, t1 = times[flat, first][:, None], times[flat, last][:, None]
        gained = (t1 > t0) & (r1 - r0 >= least * (t1 - t0) / 60)
        sums = _window_sums(values, times, counts, window, gained)
        for k, i in enumerate(members):
            start = k * columns * width
            out[i] = BlockVerdicts(
                [text[start + c * width : start + (c + 1) * width] for c in range(columns)],
                [sums.get((k, c)) for c in range(columns)],
            )
    return [out[i] for i in range(len(blocks))]


def _window_sums(
    values: np.ndarray, times: np.ndarray, counts: np.ndarray, window: int, look: np.ndarray
) -> dict[tuple[int, int], WindowSums]:
    """The window's sums of each (block, column) where `look` holds."""
    if not look.any():
        return {}
    rows = np.arange(len(counts))[:, None]
    at = (counts[:, None] - window + np.arange(window)) % WINDOW  # oldest first
    y = values[rows, at].astype(np.float64)  # (blocks, window, columns)
    t = times[rows, at]
    t = t - t[:, :1]
    st, stt = np.cumsum(t, axis=1)[:, -1], np.cumsum(t * t, axis=1)[:, -1]
    sy = np.cumsum(y, axis=1)[:, -1]
    sty = np.cumsum(t[:, :, None] * y, axis=1)[:, -1]
    rises = (y[:, 1:] > y[:, :-1]).sum(axis=1)
    first_t, last_t = times[rows[:, 0], at[:, 0]], times[rows[:, 0], at[:, -1]]
    out = {}
    for k, c in zip(*np.nonzero(look), strict=True):
        k, c = int(k), int(c)
        out[(k, c)] = (
            (float(first_t[k]), float(y[k, 0, c])),
            (float(last_t[k]), float(y[k, -1, c])),
            (float(st[k]), float(sy[k, c]), float(stt[k]), float(sty[k, c])),
            int(rises[k, c]),
        )
    return out
