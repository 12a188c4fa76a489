"""The Health screen: a run's metrics from AReaL's own log, the guide's checks, stalls.

A poll worker reads what the log gained since the last poll (offset-based, through the
node's agent or locally), rebuilds the report and posts it (`messages.HealthPolled`); the
next poll is armed when the last one ended (`PollChain`), so polls never overlap, and a
reply to an older request is dropped.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable

from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import clip
from areal_console.core.metrics.follow import FileAccess, LocalFiles, MetricsFollower, NodeFiles
from areal_console.core.metrics.health import TASK_REWARD, HealthThresholds
from areal_console.core.metrics.locate import HealthTarget, find_job_logs
from areal_console.core.metrics.report import HealthReport, MetricSummary, summarize
from areal_console.core.report.collect import ReportRequest
from areal_console.dialogs.report_preview import report_preview_for
from areal_console.messages import HealthPolled
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.health_banner import HealthBanner
from areal_console.widgets.metric_plot import MetricPlot
from areal_console.widgets.metric_table import MetricTable
from areal_console.widgets.status_line import StatusLine
from areal_console.workers import PollChain, Ticket, WorkerHost, background

if TYPE_CHECKING:
    from areal_console.app import ConsoleApp

POLL_SECONDS = 2.0


class HealthScreen(FilterHost, WorkerHost, Screen[None]):
    """Training health of one run: every metric, a plot, the guide's warnings, stalls."""

    BINDINGS = [
        Binding("slash", "filter", "Filter", id="health.filter",
                tooltip="Search metric names"),
        Binding("escape", "back", "Back", id="health.back",
                tooltip="Clear the search, or go back to the Cluster screen"),
        Binding("space", "mark", "Plot ±", id="health.mark",
                tooltip="Add the highlighted metric to the plot, or take it off"),
        Binding("enter", "plot_only", "Plot", id="health.plot", show=False,
                tooltip="Plot only the highlighted metric"),
        Binding("s", "capture", "Stacks", id="health.capture",
                tooltip="py-spy every rank of this job and diagnose (the answer to a stall)"),
        Binding("r", "refresh", "Refresh", id="health.refresh",
                tooltip="Read the log now instead of at the next poll"),
        Binding("b", "bug_report", "Bug report", id="health.report",
                tooltip="A bug report for AReaL's issue tracker: this run's warnings and logs, "
                "the last capture's diagnosis, versions, config (secrets masked); preview first"),
        Binding("w", "warnings", "Warnings", id="health.warnings",
                tooltip="List every warning, or fold them to the newest one (a short "
                "terminal starts folded)"),
    ]  # fmt: skip

    def __init__(
        self,
        target: HealthTarget,
        *,
        thresholds: HealthThresholds | None = None,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        super().__init__()
        self.target = target
        self.thresholds = thresholds or HealthThresholds()
        self.poll_seconds = poll_seconds
        self.text_filter = ""
        self.plotted: list[str] = []
        self.follower: MetricsFollower | None = None
        self.report: HealthReport | None = None
        self._reading = threading.Lock()
        self._summaries: list[MetricSummary] | None = None
        self._plotted_series: dict[str, tuple[list[int], list[float]]] = {}
        self.polls = PollChain(self, self.poll, group="health-poll", interval=poll_seconds)

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield HealthBanner(id="health-banner")
        yield FilterInput("search metric names…", id="health-filter", back_to="#health-table")
        with Vertical(id="health-table-box"):
            yield MetricTable(id="health-table")
        with Vertical(id="health-plot-box"):
            yield MetricPlot(id="health-plot")
        yield StatusLine(id="health-status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one(HealthBanner).show(None)
        self.query_one(StatusLine).say(f"source: {self.target.describe()}")
        self.call_after_refresh(self._focus_table)
        self.poll()

    def on_resize(self) -> None:
        self.query_one(HealthBanner).redraw()  # one line a warning on a short terminal

    def _focus_table(self) -> None:
        for table in self.query(MetricTable):
            table.focus()

    def on_unmount(self) -> None:
        if self.follower is not None:
            self.follower.close()

    # the poll worker: never touches widgets --------------------------------------------
    @background("health-poll", doing="reading the run's log", retry="press r to read it again")
    def poll(self, ticket: Ticket) -> None:
        with self._reading:  # a refresh while a slow poll still reads waits for it
            try:
                if self.follower is None:
                    self.follower = self._open_follower()
                new = self.follower.poll()
            except UserError as exc:  # no such path, a node that dropped: in the banner
                self.post_message(HealthPolled(None, [], {}, str(exc), ticket=ticket))
                return
            except Exception as exc:  # a log that breaks the reader: said, never "reading…"
                error = f"cannot read the run's log: {exc.__class__.__name__}: {clip(exc)}"
                self.post_message(HealthPolled(None, [], {}, error, ticket=ticket))
                return
            report = self.follower.report()  # the stall verdict changes with time alone
            names = self._plot_names(report)
            if new or self._summaries is None or names != list(self._plotted_series):
                # Everything else changes only with new steps: recomputed only then.
                self._summaries = summarize(self.follower.store, self.thresholds.window)
                self._plotted_series = {n: self.follower.store.series(n) for n in names}
            summaries, plotted = self._summaries, self._plotted_series
        self.post_message(HealthPolled(report, summaries, plotted, ticket=ticket))

    def _open_follower(self) -> MetricsFollower:
        target = self.target
        fleet = self.console.fleet
        files: FileAccess = LocalFiles(target.owner)
        path = target.path
        if path is None:
            if fleet is None:
                raise UserError("no live nodes to look for the job on: give :health PATH")
            session, found = find_job_logs(fleet, target.match)
            files, path = NodeFiles(session, found.owner), found.path
        elif target.node is not None:
            if fleet is None:
                raise UserError(f"node {target.node} is not connected")
            try:
                files = NodeFiles(fleet.session(target.node), target.owner)
            except KeyError:
                raise UserError(f"no node {target.node} among the console's nodes") from None
        return MetricsFollower(path, files, self.thresholds)

    def _plot_names(self, report: HealthReport) -> list[str]:
        names = list(self.plotted)
        if names:
            return names
        warned = [w.metric for w in report.warnings if w.metric in report.store]
        default = warned[:2] or ([TASK_REWARD] if TASK_REWARD in report.store else [])
        return default or report.store.names()[:1]

    @on(HealthPolled)
    def _polled(self, message: HealthPolled) -> None:
        if not self.fresh(message):
            return  # an answer to an older request
        if message.report is None:
            self.query_one(HealthBanner).show(None, message.error)
            self.query_one(StatusLine).say(f"source: {self.target.describe()} · {message.error}")
        else:
            self._draw(message)

    def _draw(self, snap: HealthPolled) -> None:
        report = snap.report
        assert report is not None
        self.report = report
        if not self.plotted:
            self.plotted = list(snap.plotted)
        warned = frozenset(w.metric for w in report.warnings if w.active)
        with self.app.batch_update():
            self.query_one(HealthBanner).show(report)
            self.query_one(MetricTable).show(snap.summaries, self.text_filter,
                                             frozenset(self.plotted), warned)  # fmt: skip
            self.query_one(MetricPlot).show(snap.plotted, report.warnings)
        steps = report.steps
        where = f"{steps[0]}-{steps[-1]}" if steps else "none yet"
        total = f" of {report.total_steps}" if report.total_steps else ""
        status = (f"source: {report.source} · steps {where} ({len(steps)}{total}) · "
                  f"{len(snap.summaries)} metrics")  # fmt: skip
        if self.text_filter:
            status += f" · search: {self.text_filter!r}"
        self.query_one(StatusLine).say(status)

    def _replot(self) -> None:
        """Redraw the plot and marks from the data already read (no I/O)."""
        if self.follower is None or self.report is None:
            return
        store = self.follower.store
        self.query_one(MetricPlot).show({n: store.series(n) for n in self.plotted},
                                        self.report.warnings)  # fmt: skip
        summaries = summarize(store, self.thresholds.window)
        warned = frozenset(w.metric for w in self.report.warnings if w.active)
        self.query_one(MetricTable).show(summaries, self.text_filter, frozenset(self.plotted),
                                         warned)  # fmt: skip

    # actions ----------------------------------------------------------------------------
    def filter_changed(self) -> None:
        self._replot()

    def action_back(self) -> None:
        if not self.close_filter():
            self.console.action_goto("nodes")

    def action_mark(self) -> None:
        name = self.query_one(MetricTable).highlighted_metric()
        if name is None:
            return
        if name in self.plotted:
            self.plotted.remove(name)
        else:
            self.plotted.append(name)
        self._replot()

    def action_plot_only(self) -> None:
        name = self.query_one(MetricTable).highlighted_metric()
        if name is not None:
            self.plotted = [name]
            self._replot()

    @on(DataTable.RowSelected, "#health-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.plotted = [event.row_key.value]
            self._replot()

    def action_capture(self) -> None:
        match = self.target.match or self.console.capture_state.match or self._match_from_path()
        self.console.action_capture_stacks(match=match)

    def _match_from_path(self) -> str | None:
        """The trial name of `<fileroot>/logs/<user>/<experiment>/<trial>`: in every
        worker's command line (`--trial-name T`)."""
        path = self.target.path or ""
        parts = path.rstrip("/").split("/")
        if "logs" in parts[:-3] and len(parts) >= 4:
            trial = parts[-1] if not parts[-1].endswith(".log") else parts[-2]
            return re.escape(trial)
        return None

    def action_bug_report(self) -> None:
        follower = self.follower
        request = ReportRequest(
            log_path=follower.path if follower is not None else self.target.path,
            log_node=follower.files.node if follower is not None else self.target.node,
        )
        shown = self.console.shown_capture()
        analysis, diagnosis = shown if shown is not None else (None, None)
        self.app.push_screen(report_preview_for(self.console, analysis, diagnosis, request))

    def action_warnings(self) -> None:
        self.query_one(HealthBanner).toggle()

    def action_refresh(self) -> None:
        self.poll()
