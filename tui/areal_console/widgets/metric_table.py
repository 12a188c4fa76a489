"""Every metric of a run: latest, min, max, trend over the last steps, sparkline."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from areal_console.core.metrics.health import GUIDE_METRICS
from areal_console.core.metrics.report import MetricSummary
from areal_console.widgets.keyed_rows import sync_rows
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.vim_table import VimTable

COLUMNS = ("plot", "metric", "latest", "min", "max", "trend", "last steps")


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def ordered(summaries: Sequence[MetricSummary]) -> list[MetricSummary]:
    """The guide's metrics first (in its order), then the rest by name."""
    rank = {name: i for i, name in enumerate(GUIDE_METRICS)}
    return sorted(summaries, key=lambda s: (rank.get(s.name, len(rank)), s.name))


def cells(s: MetricSummary, plotted: bool, warned: bool) -> tuple[str | Text, ...]:
    name = remote_text(s.name, style="bold yellow" if warned else "")
    return ("●" if plotted else "", name, fmt(s.latest), fmt(s.minimum), fmt(s.maximum),
            f"{s.trend:+.3g}", s.spark)  # fmt: skip


class MetricTable(VimTable):
    """Rows keyed by metric name and updated in place. A long name is cut where the
    numbers would not fit beside it (after the sparkline is cut); the plot's legend (enter)
    has it whole."""

    select_on_click = False  # selecting (enter) plots the metric
    cut_columns = ("last steps", "metric")

    DEFAULT_CSS = """
    MetricTable { height: 1fr; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for name in COLUMNS:
            self.add_column(name, key=name)

    def show(
        self,
        summaries: Sequence[MetricSummary],
        text_filter: str = "",
        plotted: frozenset[str] = frozenset(),
        warned: frozenset[str] = frozenset(),
    ) -> None:
        needle = text_filter.lower()
        rows = [(s.name, cells(s, s.name in plotted, s.name in warned))
                for s in ordered(summaries) if needle in s.name.lower()]  # fmt: skip
        sync_rows(self, COLUMNS, rows)

    def highlighted_metric(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return key.value
