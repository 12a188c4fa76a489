"""The GPU pane: utilisation and memory bars and a short utilisation history per GPU."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from areal_console.core.monitor import NodeView
from areal_console.core.textfmt import bar, format_bytes, printable, sparkline

BAR_WIDTH = 16
HISTORY_WIDTH = 20


def _level_style(fraction: float | None) -> str:
    if fraction is None:
        return "dim"
    if fraction >= 0.9:
        return "red"
    if fraction >= 0.6:
        return "yellow"
    return "green"


def render_gpus(view: NodeView | None) -> RenderableType:
    """A table of the node's GPUs, or a plain sentence saying why there is none."""
    if view is None:
        return Text("No node selected.", style="dim")
    if view.state != "up" and not view.sample:
        return Text(
            printable(f"{view.name}: {view.state}" + (f" — {view.error}" if view.error else "")),
            style="yellow",
        )
    if not view.gpus:
        reason = view.gpu_error or "no NVIDIA GPUs on this node"
        return Text.assemble(
            (printable(f"{view.name}: no GPU data. "), "bold"),
            (printable(reason), "yellow"),
            ("\nProcesses are still shown below; GPU columns use CUDA_VISIBLE_DEVICES.", "dim"),
        )
    table = Table(box=None, expand=True, pad_edge=False, padding=(0, 1))
    for label, justify in (
        ("GPU", "right"),
        ("NAME", "left"),
        ("UTIL", "left"),
        ("MEMORY", "left"),
        ("HISTORY", "left"),
        ("TEMP", "right"),
        ("POWER", "right"),
    ):
        table.add_column(label, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for gpu in view.gpus:
        util, used, total = gpu.util, gpu.mem_used, gpu.mem_total
        util_frac = None if util is None else util / 100.0
        mem_frac = used / total if used is not None and total else None
        history: list[float] = list(view.gpu_history.get(gpu.index, []))
        table.add_row(
            str(gpu.index),
            Text(printable(gpu.name or "?").replace("NVIDIA ", "")),
            Text.assemble(
                (bar(util_frac, BAR_WIDTH), _level_style(util_frac)),
                f" {util if util is not None else '-':>3}%",
            ),
            Text.assemble(
                (bar(mem_frac, BAR_WIDTH), _level_style(mem_frac)),
                f" {format_bytes(used)}/{format_bytes(total)}",
            ),
            Text(sparkline(list(history), HISTORY_WIDTH), style="cyan"),
            f"{gpu.temp}°C" if gpu.temp is not None else "-",
            f"{gpu.power:.0f} W" if gpu.power is not None else "-",
        )
    return table


class GpuPane(Static):
    """GPUs of the selected node."""

    DEFAULT_CSS = """
    GpuPane { height: auto; min-height: 3; padding: 0 1; }
    """

    _shape: tuple[object, ...] | None = None

    def show(self, view: NodeView | None) -> None:
        """Redraw for `view`; the layout is redone only when the pane's shape changes (a
        1 Hz sample of the same GPUs changes their figures, not the pane's height)."""
        shape = None if view is None else (view.name, view.state, len(view.gpus), view.gpu_error)
        self.update(render_gpus(view), layout=shape != self._shape)
        self._shape = shape
