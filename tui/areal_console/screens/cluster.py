"""The Cluster screen: nodes, the selected node's GPUs, and every rank's process."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Input, Label, Static

from areal_console.core.common.rank_filter import RankFilter, parse_filter
from areal_console.core.common.rankset import brief_ranks
from areal_console.core.connection.monitor import NodeView
from areal_console.core.connection.records import ProcessRow
from areal_console.core.connection.sampling import GoneRank, IdleRank, MemoryTrend
from areal_console.core.stacks.scope import process_jobs
from areal_console.dialogs.host_key import HostKeyScreen
from areal_console.dialogs.process_detail import ProcessDetailScreen
from areal_console.toast import toast
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.gpu_pane import GpuPane
from areal_console.widgets.node_table import NodeTable
from areal_console.widgets.process_table import ProcessTable, process_matches
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.servers_pane import ServersPane, flag_lines, servers_title
from areal_console.widgets.status_line import StatusLine
from areal_console.workers import Ticket, WorkerHost, background

if TYPE_CHECKING:
    from areal_console.app import ConsoleApp


def status_text(
    views: list[NodeView],
    drilled: str | None,
    text_filter: str | RankFilter,
    show_all: bool,
    jobs: Mapping[tuple[str, int], str] | None = None,
) -> str:
    """Nodes up, then the ranks the process table shows (the drilled-in node's, under the
    filter): counted per job when it shows more than one (`jobs`: (node, pid) -> job key),
    the rank set as ranges when it is not simply 0 to the world size."""
    wanted = parse_filter(text_filter) if isinstance(text_filter, str) else text_filter
    jobs = jobs or {}
    up = sum(v.state == "up" for v in views)
    shown: dict[str | None, list[ProcessRow]] = {}
    for v in views:
        if drilled is not None and v.name != drilled:
            continue
        for p in v.processes:
            if p.rank is not None and process_matches(v.name, p, wanted):
                shown.setdefault(jobs.get((v.name, p.pid)), []).append(p)
    parts = [f"{up}/{len(views)} nodes up"]
    if len(shown) > 1 and any(shown):
        parts.append(f"{len(shown)} jobs")
        for job, ranks in sorted(shown.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
            parts.append(f"{job or 'no job'}: {ranks_text(ranks)}")
    else:
        parts.append(ranks_text(next(iter(shown.values()), [])))
    down = [v for v in views if v.state == "down"]
    if down:
        parts.append(
            f"down: {', '.join(v.name for v in down[:3])}" + ("…" if len(down) > 3 else "")
        )
    silent = [v for v in views if v.state == "unresponsive"]
    if silent:
        parts.append(f"not responding: {', '.join(v.name for v in silent[:3])}")
    if drilled:
        parts.append(f"node: {drilled} (esc: all nodes)")
    if wanted.text:
        parts.append(f"filter: {wanted.text!r}")
    if show_all:
        parts.append("all Python processes")
    return " · ".join(parts)


def ranks_text(ranks: list[ProcessRow]) -> str:
    """`4,095 ranks 0-2047,2049-4095 of world size 4096`: the count, the rank set when it
    is not all of 0 to the world size, the world size (or sizes: ranks of several jobs
    that no job key tells apart)."""
    count = len(ranks)
    text = f"{count:,} rank{'' if count == 1 else 's'}"
    worlds = sorted({p.world_size for p in ranks if p.world_size})
    if len(worlds) == 1:
        numbers = [p.rank for p in ranks if p.rank is not None]
        if sorted(numbers) != list(range(worlds[0])):
            text += f" {brief_ranks(numbers, 40)}"
        text += f" of world size {worlds[0]}"
    elif worlds:
        text += f" (world sizes {', '.join(map(str, worlds))})"
    return text


def memory_text(
    trends: dict[tuple[str, int], MemoryTrend], gone: list[GoneRank], idle: list[IdleRank]
) -> str:
    """The status line's tail: processes whose RSS grows steadily, ranks gone lately, ranks
    whose GPUs idle while the others' are busy."""
    parts = []
    growing = [(node, pid) for (node, pid), t in trends.items() if t.growth is not None]
    if growing:
        names = ", ".join(f"{node} pid {pid}" for node, pid in growing[:3])
        parts.append(f"RSS growing: {names}" + ("…" if len(growing) > 3 else ""))
    if gone:
        names = ", ".join(f"{g.node} rank {g.rank}" for g in gone[-3:])
        parts.append(f"gone: {names}")
    if idle:
        names = ", ".join(f"{i.gpu.node} rank {i.gpu.rank}" for i in idle[:3])
        parts.append(f"GPU idle: {names}" + ("…" if len(idle) > 3 else ""))
    return "".join(f" · {part}" for part in parts)


# Over this many processes a typed filter waits for a pause in typing (FILTER_PAUSE s).
MANY_PROCESSES = 1000
FILTER_PAUSE = 0.3


class ClusterScreen(FilterHost, WorkerHost, Screen[None]):
    """Live GPUs and processes of every node, refreshed about once a second."""

    BINDINGS = [
        Binding(
            "slash",
            "filter",
            "Filter",
            id="cluster.filter",
            tooltip="Filter nodes and processes: ranks (0-2047,4095), node:NAME, role:ROLE, "
            "or text (job, pid, command)",
        ),
        Binding(
            "escape",
            "back",
            "Back",
            id="cluster.back",
            tooltip="Clear the filter or leave the drilled-in node",
        ),
        Binding(
            "enter",
            "drill",
            "Drill in",
            id="cluster.drill",
            show=False,
            tooltip="On a node: show only its processes. On a process: its command line, "
            "rank variables, GPU memory and (s) its stack",
        ),
        Binding(
            "s",
            "capture",
            "Capture stacks",
            id="cluster.capture",
            tooltip="py-spy every rank of every node at once (only the filtered job's "
            "processes while a / filter is set), then diagnose the hang",
        ),
        Binding(
            "h",
            "health",
            "Health",
            id="cluster.health",
            tooltip="Training health of the filtered job: its metrics from AReaL's log, the "
            "guide's checks, stalls",
        ),
        Binding(
            "a",
            "toggle_all",
            "All procs",
            id="cluster.all",
            tooltip="Toggle between ranks only and every Python process",
        ),
        Binding(
            "o",
            "sort_nodes",
            "Sort nodes",
            id="cluster.sort",
            tooltip="Cycle the node order: name, state, GPU utilisation",
        ),
        Binding(
            "P",
            "sort_processes('cpu')",
            "Sort by CPU",
            id="cluster.sort_cpu",
            show=False,
            tooltip="Processes by CPU use, largest first (again: back to rank order)",
        ),
        Binding(
            "M",
            "sort_processes('rss')",
            "Sort by RSS",
            id="cluster.sort_rss",
            show=False,
            tooltip="Processes by resident memory, largest first (again: rank order)",
        ),
        Binding(
            "V",
            "sort_processes('gpumem')",
            "Sort by GPU mem",
            id="cluster.sort_gpumem",
            show=False,
            tooltip="Processes by GPU memory, largest first (again: rank order)",
        ),
        Binding(
            "p",
            "focus_processes",
            "Processes",
            id="cluster.processes",
            show=False,
            tooltip="Move the cursor to the process pane",
        ),
        Binding(
            "n",
            "focus_nodes",
            "Nodes",
            id="cluster.nodes",
            show=False,
            tooltip="Move the cursor to the node list",
        ),
    ]

    NODE_ORDERS = ("name", "state", "util")

    def __init__(self, refresh_interval: float = 1.0, text_filter: str = "") -> None:
        super().__init__()
        self.refresh_interval = refresh_interval
        self.text_filter = text_filter
        self.drilled: str | None = None
        self.show_all = False
        self.node_order = "name"
        self._views: list[NodeView] = []
        self._asked_host_keys: set[tuple[str, str]] = set()
        self._gpu_title = ""
        self._servers_title = ""
        self._filter_timer: Timer | None = None

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        with Vertical(id="nodes-box"):
            yield Label("Nodes", classes="pane-title")
            yield NodeTable(id="nodes")
        with Vertical(id="gpus-box"):
            yield Label("GPUs", classes="pane-title", id="gpus-title")
            yield GpuPane(id="gpus")
        with Vertical(id="servers-box"):
            yield Label("Servers", classes="pane-title", id="servers-title")
            yield ServersPane(id="servers")
            yield Static(id="server-flags")
        with Vertical(id="procs-box"):
            yield Label("Processes", classes="pane-title")
            yield ProcessTable(id="processes")
        yield FilterInput(
            "filter: ranks (0-15,4095), node:NAME, role:ROLE, or text in job, pid, command",
            id="filter",
            back_to="#processes",
            hide_on_enter=True,  # the status line shows the filter
        )
        yield StatusLine("connecting…", id="status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one("#servers-box").display = False
        self.set_filter(self.text_filter)
        self.refresh_view()
        self.set_interval(self.refresh_interval, self.refresh_view)

    # drawing --------------------------------------------------------------------------
    def refresh_view(self) -> None:
        """Redraw from the monitor's newest data; skipped while another screen is on top."""
        if not self.is_current and self._views:
            return
        views = self._sorted(self.console.monitor.snapshot())
        self._views = views
        wanted = parse_filter(self.text_filter)
        nodes = self.query_one(NodeTable)
        nodes.update_nodes(views, wanted)
        selected = self._selected_view()
        self.query_one(GpuPane).show(selected)
        title = f"GPUs — {selected.name}" if selected else "GPUs"
        if title != self._gpu_title:  # an unchanged title costs no layout pass
            self._gpu_title = title
            self.query_one("#gpus-title", Label).update(remote_text(title))
        rows = [
            (v.name, p)
            for v in views
            if self.drilled is None or v.name == self.drilled
            for p in v.processes
        ]
        monitor = self.console.monitor
        trends = monitor.memory((n, p.pid) for n, p in rows)
        jobs = process_jobs((v.name, (p.raw for p in v.processes)) for v in views)
        self.query_one(ProcessTable).update_processes(rows, wanted, trends, jobs)
        self._show_servers(views)
        status = status_text(views, self.drilled, wanted, self.show_all, jobs)
        self.query_one(StatusLine).say(
            status + memory_text(trends, monitor.recent_gone(), monitor.idle_gpus())
        )
        self._ask_about_host_keys(views)

    def _show_servers(self, views: list[NodeView]) -> None:
        """The Servers pane, shown only while some node runs an inference server."""
        trainer = self.console.monitor.trainer_state()
        pane = self.query_one(ServersPane)
        lines = pane.show_servers(((v.name, v.processes) for v in views), trainer)
        box = self.query_one("#servers-box")
        if box.display != bool(lines):
            box.display = bool(lines)
        if lines:
            flagged = [line for line in lines if line.flags]
            flags = self.query_one("#server-flags", Static)
            flags.display = bool(flagged)
            flags.update(flag_lines(flagged))
            title = servers_title(len(lines), trainer)
            if title != self._servers_title:  # an unchanged title costs no layout pass
                self._servers_title = title
                self.query_one("#servers-title", Label).update(remote_text(title))

    def _ask_about_host_keys(self, views: list[NodeView]) -> None:
        """Show each unknown host key once, and let the user trust it."""
        for view in views:
            if not view.host_key or (view.name, view.host_key) in self._asked_host_keys:
                continue
            self._asked_host_keys.add((view.name, view.host_key))
            name = view.name

            def answered(trust: bool | None, name: str = name) -> None:
                if trust:
                    self._trust_host_key(name)
                else:
                    toast(
                        self, f"{name}: host key refused; the node stays down", severity="warning"
                    )

            self.app.push_screen(HostKeyScreen(view.name, view.address, view.host_key), answered)
            return  # one question at a time

    @background(
        "host-keys",
        doing="trusting the host key",
        retry="restart the console to be asked again",
        exclusive=False,
    )
    def _trust_host_key(self, ticket: Ticket, name: str) -> None:
        self.console.monitor.trust_host_key(name)
        self.app.call_from_thread(self.notify, f"{name}: host key trusted; connecting")

    def _sorted(self, views: list[NodeView]) -> list[NodeView]:
        if self.node_order == "state":
            order = {"down": 0, "connecting": 1, "up": 2}
            return sorted(views, key=lambda v: (order.get(v.state, 3), v.name))
        if self.node_order == "util":

            def util(v: NodeView) -> float:
                vals = [g.util for g in v.gpus if g.util is not None]
                return -(sum(vals) / len(vals)) if vals else 1.0

            return sorted(views, key=lambda v: (util(v), v.name))
        return views

    def _selected_view(self) -> NodeView | None:
        name = self.drilled or self.query_one(NodeTable).selected_node
        for v in self._views:
            if v.name == name:
                return v
        return self._views[0] if self._views else None

    @on(DataTable.RowHighlighted, "#nodes")
    def _node_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.query_one(GpuPane).show(self._selected_view())

    @on(DataTable.RowSelected, "#nodes")
    def _node_selected(self, event: DataTable.RowSelected) -> None:
        self.action_drill()

    @on(DataTable.RowSelected, "#processes")
    def _process_selected(self, event: DataTable.RowSelected) -> None:
        """enter on a process: its full record and, one key away, its stack."""
        chosen = self.query_one(ProcessTable).selected_process
        if chosen is not None:
            node, process = chosen
            self.app.push_screen(ProcessDetailScreen(self.console.fleet, node, process))

    def action_sort_processes(self, by: str) -> None:
        table = self.query_one(ProcessTable)
        by = "rank" if table.sort_by == by else by
        table.set_sort(by)
        names = {"rank": "rank", "cpu": "CPU", "rss": "RSS", "gpumem": "GPU memory"}
        toast(self, f"Processes sorted by {names[by]}")

    # actions --------------------------------------------------------------------------
    def filter_changed(self) -> None:
        """A typed filter applies at once on a small fleet; on a large one (a change of
        thousands of rows costs a good part of a second) once typing pauses, or on enter."""
        self._cancel_filter_timer()
        if sum(len(v.processes) for v in self._views) < MANY_PROCESSES:
            self.refresh_view()
            return
        self._filter_timer = self.set_timer(FILTER_PAUSE, self._apply_filter)

    def _cancel_filter_timer(self) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None

    def _apply_filter(self) -> None:
        self._cancel_filter_timer()
        self.refresh_view()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        self._apply_filter()

    def action_back(self) -> None:
        if self.close_filter():
            self._apply_filter()
            return
        if self.drilled:
            self.drilled = None
            self.query_one(NodeTable).focus()
        else:
            return
        self.refresh_view()

    def action_drill(self) -> None:
        name = self.query_one(NodeTable).selected_node
        if name:
            self.drilled = name
            self.refresh_view()
            self.query_one(ProcessTable).focus()

    def _command_line_match(self) -> str | None:
        """The filter as a regex on command lines, for `s` and `h`: text only (a rank set,
        `node:` or `role:` picks no job by its command line)."""
        wanted = parse_filter(self.text_filter)
        if not wanted.text or wanted.structured:
            return None
        return re.escape(self.text_filter)

    def action_capture(self) -> None:
        self.console.action_capture_stacks(match=self._command_line_match())

    def action_health(self) -> None:
        self.console.open_health_for_job(self._command_line_match())

    def action_toggle_all(self) -> None:
        self.show_all = not self.show_all
        self.console.monitor.set_include_all(self.show_all)
        toast(self, "Showing every Python process" if self.show_all else "Showing job processes")
        self.refresh_view()

    def action_sort_nodes(self) -> None:
        i = self.NODE_ORDERS.index(self.node_order)
        self.node_order = self.NODE_ORDERS[(i + 1) % len(self.NODE_ORDERS)]
        table = self.query_one(NodeTable)
        table.clear()
        self.refresh_view()
        toast(self, f"Nodes sorted by {self.node_order}")

    def action_focus_processes(self) -> None:
        self.query_one(ProcessTable).focus()

    def action_focus_nodes(self) -> None:
        self.query_one(NodeTable).focus()

    # for other screens ----------------------------------------------------------------
    def show_node(self, name: str, text_filter: str = "") -> None:
        """Drill into `name` (and optionally filter), as if chosen with enter and `/`."""
        self.drilled = name
        self.set_filter(text_filter)
        self.refresh_view()
        self.query_one(ProcessTable).focus()
