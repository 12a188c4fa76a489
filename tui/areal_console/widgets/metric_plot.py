"""The chosen metrics over global steps (plotext, through textual-plotext)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual_plotext import PlotextPlot

from areal_console.widgets.remote_text import remote_line


class MetricPlot(PlotextPlot):
    DEFAULT_CSS = """
    MetricPlot { height: 1fr; min-height: 8; }
    """

    def show(self, series: Mapping[str, tuple[Sequence[int], Sequence[float]]]) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel("global step")
        if not series:
            plt.title("space marks metrics to plot")
        for name, (steps, values) in series.items():
            if steps:
                plt.plot(list(steps), list(values), label=remote_line(name), marker="braille")
        self.refresh()
