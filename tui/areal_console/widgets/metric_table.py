"""Every metric of a run: latest, min, max, trend over the last steps, sparkline."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

from areal_console.core.metrics.health import GUIDE_METRICS
from areal_console.core.metrics.report import MetricSummary
from areal_console.widgets.keyed_rows import sync_rows
from areal_console.widgets.remote_text import remote_line
from areal_console.widgets.vim_table import VimTable, columns_for

COLUMNS = ("plot", "metric", "latest", "min", "max", "trend", "last steps")
SPARE = ("min", "max")  # on a narrow terminal, room for the metric's name

# What `show` was given last (drawn again when a resize changes the columns).
ShowArgs = tuple[Sequence[MetricSummary], str, frozenset[str], frozenset[str]]


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def ordered(summaries: Sequence[MetricSummary]) -> list[MetricSummary]:
    """The guide's metrics first (in its order), then the rest by name."""
    rank = {name: i for i, name in enumerate(GUIDE_METRICS)}
    return sorted(summaries, key=lambda s: (rank.get(s.name, len(rank)), s.name))


def middle_cut(name: str, width: int) -> str:
    """`name` in `width` cells, cut in the middle: AReaL's names share their starts
    (`ppo_actor/update/...`) and differ at the end, so the end is kept whole first."""
    if len(name) <= width:
        return name
    if width < 2:
        return name[-width:] if width > 0 else ""
    head = min(len(name.split("/", 1)[0]), width // 4)
    return name[:head] + "…" + name[len(name) - (width - head - 1) :]


class MetricName:
    """A metric's name in its cell: measured whole, drawn cut in the middle when the column
    is narrower than it (the table cuts this column before the numbers)."""

    def __init__(self, name: str, style: str = "") -> None:
        self.name = name
        self.style = style

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetricName):
            return False
        return (self.name, self.style) == (other.name, other.style)

    def __hash__(self) -> int:
        return hash((self.name, self.style))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(len(self.name), len(self.name))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(middle_cut(self.name, options.max_width), style=self.style, no_wrap=True)


def cells(s: MetricSummary, plotted: bool, warned: bool) -> tuple[str | MetricName, ...]:
    name = MetricName(remote_line(s.name), "bold yellow" if warned else "")
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
        self._last: ShowArgs = ((), "", frozenset(), frozenset())
        self._set_columns()

    def _set_columns(self) -> bool:
        return self.show_columns(columns_for(self.app.size.width, [(c, c) for c in COLUMNS], SPARE))

    def on_resize(self) -> None:
        if self._set_columns():
            self.show(*self._last)
        super().on_resize()

    def show(
        self,
        summaries: Sequence[MetricSummary],
        text_filter: str = "",
        plotted: frozenset[str] = frozenset(),
        warned: frozenset[str] = frozenset(),
    ) -> None:
        self._last = (summaries, text_filter, plotted, warned)
        needle = text_filter.lower()
        index = [COLUMNS.index(c) for c in self.column_keys]
        rows = []
        for s in ordered(summaries):
            if needle in s.name.lower():
                row = cells(s, s.name in plotted, s.name in warned)
                rows.append((s.name, tuple(row[i] for i in index)))
        sync_rows(self, self.column_keys, rows)

    def highlighted_metric(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return key.value
