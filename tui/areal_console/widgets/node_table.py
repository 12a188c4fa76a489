"""The node list: one keyed row per node, cells updated in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from areal_console.core.common.textfmt import format_bytes
from areal_console.core.connection.monitor import NodeView
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.vim_table import VimTable

STATE_STYLE = {
    "up": "green",
    "down": "bold red",
    "connecting": "yellow",
    "unresponsive": "bold yellow",
}

COLUMNS = (
    ("node", "NODE"),
    ("state", "STATE"),
    ("latency", "LATENCY"),
    ("gpus", "GPUS"),
    ("util", "UTIL"),
    ("mem", "GPU MEM"),
    ("ranks", "RANKS"),
    ("detail", "DETAIL"),
)


def node_cells(view: NodeView) -> dict[str, str | Text]:
    gpus = view.gpus
    utils = [g.util for g in gpus if g.util is not None]
    used = sum(g.mem_used or 0 for g in gpus)
    total = sum(g.mem_total or 0 for g in gpus)
    ranks = [p for p in view.processes if p.rank is not None]
    if view.host_key:
        detail = f"unknown host key {view.host_key}: trust it? (y/n)"
    elif view.state in ("down", "unresponsive"):
        detail = view.error or view.state
    elif view.state == "connecting":
        detail = "connecting…"
    elif view.gpu_error and not gpus:
        detail = "no GPU data (NVML unavailable)"
    else:
        detail = view.hostname
    return {
        "node": remote_text(view.name),
        "state": Text(view.state, style=STATE_STYLE.get(view.state, "")),
        "latency": f"{view.latency * 1000:.0f} ms" if view.latency is not None else "-",
        "gpus": str(len(gpus)) if gpus else "-",
        "util": f"{sum(utils) / len(utils):.0f}%" if utils else "-",
        "mem": f"{format_bytes(used)}/{format_bytes(total)}" if total else "-",
        "ranks": str(len(ranks)),
        "detail": remote_text(detail),
    }


class NodeTable(VimTable):
    """Nodes with state, latency, GPUs and ranks; keyed by node name."""

    DEFAULT_CSS = """
    NodeTable { height: auto; max-height: 12; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in COLUMNS:
            self.add_column(label, key=key)
        self._shown: dict[str, tuple[str, ...]] = {}  # node -> each cell's text as shown

    def clear(self, columns: bool = False) -> NodeTable:
        self._shown = {}
        super().clear(columns)
        return self

    def update_nodes(self, views: Sequence[NodeView], text_filter: str = "") -> None:
        wanted = [v for v in views if _matches(v, text_filter)]
        wanted_keys = {v.name for v in wanted}
        shown = self._shown
        for key in [k for k in shown if k not in wanted_keys]:
            self.remove_row(key)
            del shown[key]
        changes: list[tuple[str, str, Any]] = []
        for view in wanted:
            cells = node_cells(view)
            texts = tuple(str(cells[k]) for k, _ in COLUMNS)
            before = shown.get(view.name)
            shown[view.name] = texts
            if before is None:
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=view.name)
                continue
            changes.extend(
                (view.name, key, cells[key])
                for i, (key, _) in enumerate(COLUMNS)
                if before[i] != texts[i]
            )
        self.update_cells(changes)

    @property
    def selected_node(self) -> str | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        except Exception:
            return None
        return key.value


def _matches(view: NodeView, text_filter: str) -> bool:
    if not text_filter:
        return True
    needle = text_filter.lower()
    hay = f"{view.name} {view.address} {view.state} {view.error or ''}".lower()
    if needle in hay:
        return True
    # A node stays listed while any of its processes matches (a filter on one job).
    return any(needle in f"{p.pid} {p.role} {p.cmdline}".lower()
               for p in view.processes)  # fmt: skip
