"""Every metric of a run: latest, min, max, trend over the last steps, sparkline."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

from areal_console.core.metrics.health import GUIDE_METRICS
from areal_console.core.metrics.report import MetricSummary

COLUMNS = ("plot", "metric", "latest", "min", "max", "trend", "last steps")


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def ordered(summaries: Sequence[MetricSummary]) -> list[MetricSummary]:
    """The guide's metrics first (in its order), then the rest by name."""
    rank = {name: i for i, name in enumerate(GUIDE_METRICS)}
    return sorted(summaries, key=lambda s: (rank.get(s.name, len(rank)), s.name))


def cells(s: MetricSummary, plotted: bool, warned: bool) -> tuple[str | Text, ...]:
    name = Text(s.name, style="bold yellow" if warned else "")
    return ("●" if plotted else "", name, fmt(s.latest), fmt(s.minimum), fmt(s.maximum),
            f"{s.trend:+.3g}", s.spark)  # fmt: skip


class MetricTable(DataTable[str | Text]):
    """Rows keyed by metric name and updated in place."""

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
        visible = [s for s in ordered(summaries) if needle in s.name.lower()]
        keys = [s.name for s in visible]
        wanted = set(keys)
        for key in list(self.rows):
            if key.value not in wanted:
                self.remove_row(key)
        if [k.value for k in self.rows] != keys[: len(self.rows)]:
            self.clear()  # order changed (a new metric appeared early): redraw
        for s in visible:
            row = cells(s, s.name in plotted, s.name in warned)
            if s.name in self.rows:
                for column, value in zip(COLUMNS, row, strict=True):
                    if self.get_cell(s.name, column) != value:
                        self.update_cell(s.name, column, value)
            else:
                self.add_row(*row, key=s.name)

    def highlighted_metric(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return key.value
