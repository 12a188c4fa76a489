"""The Slurm view: jobs in the queue with their nodes and state; `enter` opens one."""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Label

from areal_console.core.common.errors import UserError
from areal_console.core.slurm.client import SlurmJob, job_matches, job_row
from areal_console.messages import SlurmJobsFailed, SlurmJobsLoaded
from areal_console.toast import toast
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.vim_table import VimTable
from areal_console.workers import PollChain, Ticket, WorkerHost, background

JobLister = Callable[[bool], list[SlurmJob]]  # all_users -> jobs (blocking: Slurm commands)

COLUMNS = ("JOBID", "NAME", "USER", "STATE", "NODES", "GRES")


class SlurmJobsScreen(FilterHost, WorkerHost, Screen[str | None]):
    """Jobs from `squeue`, refreshed every few seconds; dismisses with the chosen job id.

    `list_jobs(all_users)` asks Slurm (e.g. `SlurmClient(runner).jobs`); it runs in a worker.
    The app opens the chosen job in the Cluster screen (`--slurm-job` targets).
    """

    BINDINGS = [
        Binding(
            "enter",
            "open_job",
            "Open",
            id="slurm.open",
            tooltip="Open the highlighted job's nodes in the Cluster screen",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="slurm.filter",
            tooltip="Filter jobs by id, name, user, state or node",
        ),
        Binding(
            "escape",
            "back",
            "Back",
            id="slurm.back",
            tooltip="Clear the filter, or leave the Slurm view",
        ),
        Binding(
            "u",
            "toggle_users",
            "All users",
            id="slurm.users",
            tooltip="Toggle between your jobs and every user's jobs",
        ),
        Binding("r", "reload", "Reload", id="slurm.reload", tooltip="Ask Slurm again now"),
    ]

    def __init__(self, list_jobs: JobLister, refresh_interval: float = 5.0) -> None:
        super().__init__()
        self.list_jobs = list_jobs
        self.refresh_interval = refresh_interval
        self.jobs: list[SlurmJob] = []
        self.all_users = False
        self.text_filter = ""
        self.error: str | None = None
        self.loaded = False
        # Chained one-shot polls (never overlapping), paused while another screen is shown;
        # a lister that raises is retried later with a growing delay.
        self.polls = PollChain(self, self.load_runs, group="slurm-jobs", interval=refresh_interval)

    def compose(self) -> ComposeResult:
        yield Label("Slurm jobs", id="slurm-title")
        table = VimTable(id="slurm-jobs", cursor_type="row", zebra_stripes=True)
        table.cut_columns = ("NAME",)
        yield table
        yield FilterInput("filter jobs (esc to clear)", id="slurm-filter", back_to="#slurm-jobs")
        yield Label("asking Slurm…", id="slurm-status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.refresh_table()
        self.query_one("#slurm-jobs", DataTable).focus()
        self.load_runs()

    # loading ---------------------------------------------------------------------------
    @background("slurm-jobs", doing="asking Slurm for the jobs", retry="press r to ask again")
    def load_runs(self, ticket: Ticket) -> None:
        try:
            jobs = self.list_jobs(self.all_users)
        except (UserError, OSError) as exc:  # shown in the status line, where one looks
            self.post_message(SlurmJobsFailed(str(exc), ticket=ticket))
            return
        self.post_message(SlurmJobsLoaded(jobs, ticket=ticket))

    @on(SlurmJobsLoaded)
    def _jobs_loaded(self, message: SlurmJobsLoaded) -> None:
        if not self.fresh(message):
            return
        self.jobs, self.error, self.loaded = message.jobs, None, True
        self.refresh_table()

    @on(SlurmJobsFailed)
    def _jobs_failed(self, message: SlurmJobsFailed) -> None:
        if not self.fresh(message):
            return
        self.error, self.loaded = message.error, True
        self.refresh_status()

    # view ------------------------------------------------------------------------------
    def visible_jobs(self) -> list[SlurmJob]:
        return [j for j in self.jobs if job_matches(j, self.text_filter)]

    def refresh_table(self) -> None:
        table = self.query_one("#slurm-jobs", DataTable)
        selected = self.selected_job_id()
        visible = self.visible_jobs()
        rows = [job_row(job) for job in visible]
        # Columns follow what they show now (the job list changes wholesale); a name too
        # long for the terminal is cut, nothing else.
        table.clear(columns=True)
        for name in COLUMNS:
            table.add_column(name, key=name)
        for job, row in zip(visible, rows, strict=True):
            table.add_row(*(remote_text(cell) for cell in row), key=job.job_id)
        if selected is not None:
            for index, job in enumerate(visible):
                if job.job_id == selected:
                    table.move_cursor(row=index)
        self.refresh_status()

    def refresh_status(self) -> None:
        parts = []
        if self.loaded:
            shown = len(self.visible_jobs())
            running = sum(j.state == "RUNNING" for j in self.jobs)
            parts.append(f"{shown} of {len(self.jobs)} jobs, {running} running")
        else:
            parts.append("asking Slurm…")
        parts.append("every user" if self.all_users else "your jobs")
        if self.text_filter:
            parts.append(f"filter: {self.text_filter!r}")
        if self.error:
            parts.append(f"error: {self.error}")
        self.query_one("#slurm-status", Label).update(remote_text(" · ".join(parts)))

    def selected_job_id(self) -> str | None:
        table = self.query_one("#slurm-jobs", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return None if key.value is None else str(key.value)

    # actions ---------------------------------------------------------------------------
    @on(DataTable.RowSelected, "#slurm-jobs")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_job()

    def action_open_job(self) -> None:
        job_id = self.selected_job_id()
        if job_id is None:
            return
        job = next((j for j in self.jobs if j.job_id == job_id), None)
        if job is not None and job.state != "RUNNING":
            toast(self, f"job {job_id} is {job.state}: nothing to inspect yet", severity="warning")
            return
        self.dismiss(job_id)

    def filter_changed(self) -> None:
        self.refresh_table()

    def action_back(self) -> None:
        if not self.close_filter():
            self.dismiss(None)

    def action_toggle_users(self) -> None:
        self.all_users = not self.all_users
        self.refresh_status()
        self.load_runs()

    def action_reload(self) -> None:
        self.load_runs()
