"""A one-line terminal histogram: block characters over bins, with the value range."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from areal_console.core.batches.records import Histogram

BLOCKS = " ▁▂▃▄▅▆▇█"


def histogram_text(title: str, hist: Histogram | None, digits: int = 2) -> Text:
    """`title  lo ▁▃█▅▂ hi  (n)`; bin heights are relative to the fullest bin."""
    text = Text(f"{title:<14}", style="bold")
    counts = list(hist.counts) if hist else []
    edges = list(hist.edges) if hist else []
    if not counts or not edges:
        text.append("no data", style="dim")
        return text
    top = max(counts) or 1
    bars = "".join(
        BLOCKS[max(1, round(c / top * (len(BLOCKS) - 1)))] if c else BLOCKS[0] for c in counts
    )
    text.append(f"{edges[0]:>8.{digits}f} ", style="dim")
    text.append(bars, style="cyan")
    text.append(f" {edges[-1]:<8.{digits}f}", style="dim")
    text.append(f" n={int(sum(counts))}", style="dim")
    return text


class MiniHistogram(Static):
    """Shows one histogram (`batches.histogram`'s edges and counts)."""

    DEFAULT_CSS = """
    MiniHistogram { height: 1; }
    """

    def __init__(self, title: str, digits: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.digits = digits
        self.counts: list[float] = []

    def show(self, hist: Histogram | None) -> None:
        self.counts = list(hist.counts) if hist else []
        self.update(histogram_text(self.title, hist, self.digits))
