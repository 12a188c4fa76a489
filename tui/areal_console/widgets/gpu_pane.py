"""The GPU pane: utilisation and memory bars and a short utilisation history per GPU."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from areal_console.core.common.textfmt import bar, format_bytes, printable, sparkline
from areal_console.core.connection.monitor import NodeView

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


def gpu_widths(width: int, name: int, memory: int) -> tuple[int, int]:
    """(bar, history) widths for a pane `width` cells wide. Index, name, temperature and
    power are always shown; the bars shrink (down to none: the figures stay), and the
    history is shown only where both bars have their full width."""
    gaps = 2 * 5  # six columns, two cells between each
    fixed = 3 + name + len(" 100%") + len(" ") + memory + len("100°C") + len("1000 W") + gaps
    room = width - fixed
    bar_width = max(0, min(BAR_WIDTH, room // 2))
    if bar_width < 3:
        bar_width = 0
    spare = room - 2 * BAR_WIDTH - 2
    history = min(HISTORY_WIDTH, spare) if bar_width == BAR_WIDTH and spare >= 8 else 0
    return bar_width, history


def _figure(bar_text: str, style: str, figure: str) -> Text:
    return Text.assemble((bar_text, style), f" {figure}" if bar_text else figure)


def render_gpus(view: NodeView | None, width: int = 200) -> RenderableType:
    """A table of the node's GPUs fitted to `width` cells, or a plain sentence saying why
    there is none."""
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
    names = [printable(gpu.name or "?").replace("NVIDIA ", "") for gpu in view.gpus]
    memories = [f"{format_bytes(g.mem_used)}/{format_bytes(g.mem_total)}" for g in view.gpus]
    name_width = min(max(len(n) for n in names), 16)
    bar_width, history_width = gpu_widths(width, name_width, max(len(m) for m in memories))
    table = Table(box=None, expand=False, pad_edge=False, padding=(0, 1))
    columns = [("GPU", "right"), ("NAME", "left"), ("UTIL", "left"), ("MEMORY", "left")]
    if history_width:
        columns.append(("HISTORY", "left"))
    columns += [("TEMP", "right"), ("POWER", "right")]
    for label, justify in columns:
        table.add_column(label, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.columns[1].max_width = name_width  # a long name is cut, never the figures
    table.columns[1].overflow = "ellipsis"
    for gpu, name, memory in zip(view.gpus, names, memories, strict=True):
        util, used, total = gpu.util, gpu.mem_used, gpu.mem_total
        util_frac = None if util is None else util / 100.0
        mem_frac = used / total if used is not None and total else None
        cells: list[RenderableType] = [
            str(gpu.index),
            Text(name),
            _figure(bar(util_frac, bar_width), _level_style(util_frac),
                    f"{util if util is not None else '-':>3}%"),
            _figure(bar(mem_frac, bar_width), _level_style(mem_frac), memory),
        ]  # fmt: skip
        if history_width:
            history = list(view.gpu_history.get(gpu.index, []))
            cells.append(Text(sparkline(history, history_width), style="cyan"))
        cells += [
            f"{gpu.temp}°C" if gpu.temp is not None else "-",
            f"{gpu.power:.0f} W" if gpu.power is not None else "-",
        ]
        table.add_row(*cells)
    return table


class GpuPane(Static):
    """GPUs of the selected node."""

    DEFAULT_CSS = """
    GpuPane { height: auto; min-height: 3; padding: 0 1; }
    """

    _shape: tuple[object, ...] | None = None
    _view: NodeView | None = None

    def show(self, view: NodeView | None) -> None:
        """Redraw for `view`; the layout is redone only when the pane's shape changes (a
        1 Hz sample of the same GPUs changes their figures, not the pane's height)."""
        self._view = view
        shape = None if view is None else (view.name, view.state, len(view.gpus), view.gpu_error)
        self.update(render_gpus(view, self._width()), layout=shape != self._shape)
        self._shape = shape

    def _width(self) -> int:
        # Before the first layout the pane has no size yet: the screen's width, less padding.
        return self.content_region.width or max(20, self.app.size.width - 2)

    def on_resize(self) -> None:
        if self._shape is not None:
            self.update(render_gpus(self._view, self._width()))
