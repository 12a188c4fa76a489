"""The chosen metrics over global steps (plotext, through textual-plotext), with the
health episodes of those metrics marked: a red line where an active one began, a yellow
and a green line where an ended one began and last held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual_plotext import PlotextPlot

from areal_console.core.metrics.health import HealthWarning
from areal_console.widgets.remote_text import remote_line

# Each plotted metric's colour, named in the title: plotext draws its legend inside the
# plot, where the lines run through it.
COLOURS = ("cyan", "magenta", "yellow", "green", "red", "blue")


class MetricPlot(PlotextPlot):
    DEFAULT_CSS = """
    MetricPlot { height: 1fr; min-height: 8; }
    """

    _names: list[str] = []  # the plotted metrics, for the legend (fitted at each resize)

    def show(
        self,
        series: Mapping[str, tuple[Sequence[int], Sequence[float]]],
        episodes: Sequence[HealthWarning] = (),
    ) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel("global step")
        self._names = [remote_line(name) for name in series]
        if not series:
            plt.title("space marks metrics to plot")
        for i, (steps, values) in enumerate(series.values()):
            if steps:
                colour = COLOURS[i % len(COLOURS)]
                plt.plot(list(steps), list(values), color=colour, marker="braille")
        self._title()
        self.marks = episode_marks(series, episodes)
        for step, color in self.marks:
            plt.vline(step, color)
        self.refresh()

    def on_resize(self) -> None:
        self._title()

    def _title(self) -> None:
        # The legend as the title, fitted to the width: plotext leaves out a longer one.
        if self._names:
            self.plt.title(legend(self._names, self.size.width - 2))


def legend(names: Sequence[str], width: int) -> str:
    """`name (colour)` for each plotted metric, fitted to `width`: whole names where they
    fit, else their last two parts (`behave_imp_weight/avg`), else cut."""
    for shorten in (False, True):
        parts = []
        for i, name in enumerate(names):
            shown = "/".join(name.split("/")[-2:]) if shorten else name
            parts.append(f"{shown} ({COLOURS[i % len(COLOURS)]})")
        text = "  ".join(parts)
        if len(text) <= width:
            return text
    return text[: max(0, width - 1)] + "…"


def episode_marks(
    series: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    episodes: Sequence[HealthWarning],
) -> list[tuple[int, str]]:
    """(step, colour) of the vertical lines marking the plotted metrics' episodes."""
    marks: dict[int, str] = {}
    for w in episodes:
        if w.metric not in series or w.first_step is None:
            continue
        if w.active:
            marks[w.first_step] = "red"
        else:
            marks.setdefault(w.first_step, "yellow")
            if w.last_step is not None and w.last_step != w.first_step:
                marks.setdefault(w.last_step, "green")
    return sorted(marks.items())
