"""The node list: one keyed row per node, cells updated in place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from areal_console.core.common.rank_filter import RankFilter, parse_filter
from areal_console.core.common.textfmt import format_bytes
from areal_console.core.connection.monitor import NodeView
from areal_console.core.stacks.scope import job_key
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
    # Two jobs on one node: their rank counts apart ("4+2"), in the process table's order.
    per_job = Counter(job_key(view.name, p.raw) or "\uffff" for p in ranks)
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
    if view.relay and view.state in ("connecting", "up"):
        detail = f"{detail.rstrip('…')} · via {view.relay}"
    return {
        "node": remote_text(view.name),
        "state": Text(view.state, style=STATE_STYLE.get(view.state, "")),
        "latency": f"{view.latency * 1000:.0f} ms" if view.latency is not None else "-",
        "gpus": str(len(gpus)) if gpus else "-",
        "util": f"{sum(utils) / len(utils):.0f}%" if utils else "-",
        "mem": f"{format_bytes(used)}/{format_bytes(total)}" if total else "-",
        "ranks": "+".join(str(per_job[job]) for job in sorted(per_job)) or "0",
        "detail": remote_text(detail),
    }


class NodeTable(VimTable):
    """Nodes with state, latency, GPUs and ranks; keyed by node name. Cells are made and
    updated for the rows on screen only (the list shows a dozen of 512 nodes); rows out of
    view are brought up to date when they come into it."""

    DEFAULT_CSS = """
    NodeTable { height: auto; max-height: 12; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in COLUMNS:
            self.add_column(label, key=key)
        self._shown: dict[str, tuple[str, ...]] = {}  # node -> each cell's text as shown
        self._views: dict[str, NodeView] = {}  # node -> its newest view

    def clear(self, columns: bool = False) -> NodeTable:
        self._shown = {}
        super().clear(columns)
        return self

    def update_nodes(self, views: Sequence[NodeView], text_filter: str | RankFilter = "") -> None:
        wanted = parse_filter(text_filter) if isinstance(text_filter, str) else text_filter
        self._views = {v.name: v for v in views if node_matches(v, wanted)}
        shown = self._shown
        gone = [k for k in shown if k not in self._views]
        self.remove_rows(gone)
        for key in gone:
            del shown[key]
        for name, view in self._views.items():
            if name not in shown:
                cells = node_cells(view)
                shown[name] = tuple(str(cells[k]) for k, _ in COLUMNS)
                self.add_row(*(cells[k] for k, _ in COLUMNS), key=name)
        self._bring_up_to_date(self.keys_in_view())

    def rows_came_into_view(self) -> None:
        if self._views:
            self._bring_up_to_date(self.keys_in_view())

    def _bring_up_to_date(self, names: Sequence[str]) -> None:
        changes: list[tuple[str, str, Any]] = []
        for name in names:
            view, before = self._views.get(name), self._shown.get(name)
            if view is None or before is None:
                continue
            cells = node_cells(view)
            texts = tuple(str(cells[k]) for k, _ in COLUMNS)
            if texts == before:
                continue
            self._shown[name] = texts
            changes.extend(
                (name, key, cells[key])
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


def node_matches(view: NodeView, wanted: RankFilter) -> bool:
    """Whether the node list shows `view` under the filter: a node named so, a node with
    a rank in the set or of the role, or text in its name, address, state or error (or in
    one of its processes: a filter on one job keeps that job's nodes)."""
    if not wanted.text:
        return True
    if wanted.structured:
        if not wanted.has_node(view.name):
            return False
        if wanted.ranks is None and wanted.role is None:
            return True
        return any(
            (wanted.has_rank(p.rank) and (wanted.role is None or wanted.has_role(p.role)))
            or p.pid == wanted.number
            for p in view.processes
            if p.rank is not None or wanted.ranks is None or p.pid == wanted.number
        )
    needle = wanted.text
    hay = f"{view.name} {view.address} {view.state} {view.error or ''}".lower()
    if needle in hay:
        return True
    return any(needle in f"{p.pid} {p.role} {p.cmdline}".lower()
               for p in view.processes)  # fmt: skip
