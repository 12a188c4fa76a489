"""The chosen metrics over global steps (plotext, through textual-plotext), with the
health episodes of those metrics marked: a red line where an active one began, a yellow
and a green line where an ended one began and last held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual_plotext import PlotextPlot

from areal_console.core.metrics.health import HealthWarning
from areal_console.widgets.remote_text import remote_line


class MetricPlot(PlotextPlot):
    DEFAULT_CSS = """
    MetricPlot { height: 1fr; min-height: 8; }
    """

    def show(
        self,
        series: Mapping[str, tuple[Sequence[int], Sequence[float]]],
        episodes: Sequence[HealthWarning] = (),
    ) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel("global step")
        if not series:
            plt.title("space marks metrics to plot")
        for name, (steps, values) in series.items():
            if steps:
                plt.plot(list(steps), list(values), label=remote_line(name), marker="braille")
        self.marks = episode_marks(series, episodes)
        for step, color in self.marks:
            plt.vline(step, color)
        self.refresh()


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
