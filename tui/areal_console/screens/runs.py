"""The Runs screen: running and finished replays on every node, with a live log tail.

Rows come from two places merged by job id: each node's own job records (its agent's
`jobs` op) and the console's copies of what it launched, so a job on a node that dropped
stays listed as "unknown" with its log path. A finished replay is verified against its
recording once, in the background, and the result is shown in its row.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label, Log, Static

from areal_console.core.common.errors import UserError
from areal_console.core.common.identity import UserScope
from areal_console.core.common.textfmt import plural
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.core.slurm import runs as slurm_runs
from areal_console.dialogs.confirm import ConfirmDialog
from areal_console.messages import Notice, RunLogTail, RunsRefreshed
from areal_console.toast import toast
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.keyed_rows import sync_rows
from areal_console.widgets.remote_text import remote_line, remote_log_line, remote_text
from areal_console.widgets.vim_table import VimTable, columns_for
from areal_console.workers import PollChain, Ticket, WorkerHost, background, cancelled

COLUMNS = ("job", "node", "state", "exit", "steps", "gpus", "verification")
# Left out on a narrow terminal (columns_for), so the verdict stays whole: the detail below
# the table says both (`failed (exit 1)`, `GPUs 0,1`).
SPARE = ("exit", "gpus")
POLL_SECONDS = 1.0
TAIL_LINES = 200


@dataclass
class RunRow:
    """One job as shown: the console's record plus what its node said last."""

    record: jobs.RunRecord
    marked: bool = False

    @property
    def key(self) -> str:
        return row_key(self.record)

    def cells(self) -> tuple[str, ...]:
        r = self.record
        steps = r.steps
        v = r.verification
        if v is None:
            verdict = "—" if r.state != "finished" or not r.verifiable else "…"
        else:
            verdict = v.verdict
        return (
            ("● " if self.marked else "") + r.job_id,
            r.node,
            r.state,
            "" if r.exit_code is None else str(r.exit_code),
            f"{steps[0]}-{steps[1]}" if steps else "",
            ",".join(map(str, r.gpus)),
            verdict,
        )

    def matches(self, text: str) -> bool:
        shown = " ".join([*self.cells(), self.record.slurm_label])
        return not text or text.lower() in shown.lower()


def row_key(record: jobs.RunRecord) -> str:
    return f"{record.node}/{record.job_id}"


class RunsScreen(FilterHost, WorkerHost, Screen[None]):
    """Replay runs and other runs on every node: state, exit code, verification, live log."""

    # Keys go to the runs (never to the closed filter box): the screen opens right after the
    # replay dialog, whose typing field had the focus.
    AUTO_FOCUS = "#jobs-table"

    BINDINGS = [
        Binding(
            "slash",
            "filter",
            "Filter",
            id="jobs.filter",
            tooltip="Filter runs by any text in their row",
        ),
        Binding(
            "escape",
            "back",
            "Back",
            id="jobs.back",
            tooltip="Clear the filter, or leave the Runs screen",
        ),
        Binding(
            "enter",
            "follow",
            "Follow log",
            id="jobs.follow",
            tooltip="Tail the highlighted run's log",
        ),
        Binding(
            "space",
            "mark",
            "Mark",
            id="jobs.mark",
            tooltip="Mark or unmark the highlighted run (stop acts on the marked runs)",
        ),
        Binding(
            "s",
            "stop",
            "Stop",
            id="jobs.stop",
            tooltip="Stop the marked or highlighted runs (asks first)",
        ),
        Binding(
            "v",
            "verify",
            "Verify",
            id="jobs.verify",
            tooltip="Compare the highlighted replay's metrics with its recording again",
        ),
        Binding(
            "r", "refresh", "Refresh", id="jobs.refresh", tooltip="Ask every node for its runs now"
        ),
        Binding(
            "u",
            "toggle_users",
            "All users",
            id="jobs.users",
            show=False,  # the status line names it when other users' runs are hidden
            tooltip="Toggle between your own runs (the default) and every user's (a shared "
            "account keeps everyone's in one cache)",
        ),
    ]

    def __init__(
        self,
        fleet: Fleet,
        *,
        read_only: bool = False,
        poll: float = POLL_SECONDS,
        users: UserScope | None = None,
    ):
        super().__init__()
        self.fleet = fleet
        self.read_only = read_only
        self.poll = poll
        self.users = users or UserScope()  # the app shares one with the palette
        self.records: dict[str, jobs.RunRecord] = {}
        self.selected: str | None = None
        self.text_filter = ""
        self._verifying: set[str] = set()
        self.marked: set[str] = set()
        self._log_key: str | None = None
        # Hidden (another screen shown), the Runs screen neither asks the nodes nor
        # rewrites job files; a failed poll is retried later, not given up.
        self.polls = PollChain(self, self.refresh_jobs, group="jobs-poll", interval=poll)
        self._wanted: str | None = None  # a job to put the cursor on once it is listed

    def compose(self) -> ComposeResult:
        with Vertical():
            yield FilterInput("filter jobs…", id="jobs-filter", back_to="#jobs-table")
            table = VimTable(id="jobs-table", cursor_type="row")
            # A narrow terminal cuts the job's name (whole in the detail below), never
            # its state or verdict.
            table.cut_columns = ("job",)
            table.cut_tails = {"job": 14}  # `-HHMMSS-hex`: every replay's id starts the same
            yield table
            yield Static("", id="jobs-detail")
            yield Log(id="jobs-log", max_lines=2000)
            yield Label("", id="jobs-status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self._set_columns()
        self.query_one("#jobs-table", DataTable).focus()
        self.refresh_jobs()

    def _set_columns(self) -> bool:
        """The table's columns for the terminal's width; whether they changed."""
        columns = columns_for(self.app.size.width, [(c, c) for c in COLUMNS], SPARE)
        return self.query_one("#jobs-table", VimTable).show_columns(columns)

    def on_resize(self, _event: events.Resize) -> None:
        if self._set_columns():  # rows again, in the new columns
            self._draw()

    # polling: one refresh at a time, the next armed when the last one ended (PollChain) ---
    @background("jobs-poll", doing="reading every node's jobs", retry="press r to refresh")
    def refresh_jobs(self, ticket: Ticket) -> None:
        answers = jobs.node_jobs(self.fleet)
        if cancelled():
            return
        known = jobs.load_runs()
        launched_here = {(r.node, r.job_id) for r in known}
        records = jobs.merge_runs(known, answers)
        for r in records:
            if r.slurm_job and r.state == "running":
                try:
                    slurm_runs.refresh_slurm(r)  # Slurm, not a node's agent, knows these
                except Exception as exc:
                    r.error = f"Slurm: {exc}"
        if cancelled():
            return  # a newer refresh writes the files
        for r in records:
            if (r.node, r.job_id) in launched_here:
                jobs.save_run(r)  # the console's copy follows the node's state
        self.post_message(RunsRefreshed(records, ticket=ticket))

    @on(RunsRefreshed)
    def _refreshed(self, message: RunsRefreshed) -> None:
        if not self.fresh(message):
            return
        self.records = {jobs_row.key: jobs_row.record for jobs_row in map(RunRow, message.records)}
        self._draw()
        for row in map(RunRow, message.records):
            r = row.record
            if (
                r.state == "finished"
                and r.verification is None
                and r.verifiable
                and row.key not in self._verifying
            ):
                self._verifying.add(row.key)
                self.verify_run(row.key, quiet=True)
        if self._log_key is not None:
            self.follow_log(self._log_key)

    def _draw(self) -> None:
        table = self.query_one("#jobs-table", VimTable)
        theirs = [r for r in self.records.values() if not self.users.shows(r.user)]
        rows = [
            RunRow(r, row_key(r) in self.marked)
            for r in self.records.values()
            if self.users.shows(r.user)
        ]
        visible = [row for row in rows if row.matches(self.text_filter)]
        keys = [row.key for row in visible]
        shown = [COLUMNS.index(key) for key in table.column_keys]
        with self.app.batch_update():
            sync_rows(table, table.column_keys,
                      [(row.key, [row.cells()[i] for i in shown]) for row in visible])  # fmt: skip
        if self._wanted in keys:
            self.selected, self._wanted = self._wanted, None
            self.action_follow()
        elif self.selected not in keys and visible:
            self.selected = visible[0].key
            self.action_follow()
        if self.selected in keys and table.cursor_row != keys.index(self.selected):
            table.move_cursor(row=keys.index(self.selected))
        self._show_detail()
        running = sum(
            r.state == "running" for r in self.records.values() if self.users.shows(r.user)
        )
        status = f"{plural(len(rows), 'job')}, {running} running"
        if theirs:
            status += f" · {plural(len(theirs), 'job')} of other users hidden (u shows them)"
        elif self.users.everyone:
            status += " · every user's (u: yours only)"
        if self.text_filter:
            status += f" · filter: {self.text_filter!r}"
        if self.read_only:
            status += " · read-only"
        self.query_one("#jobs-status", Label).update(remote_text(status))

    def _show_detail(self) -> None:
        record = self.records.get(self.selected or "")
        detail = self.query_one("#jobs-detail", Static)
        if record is None:
            detail.update("no jobs yet: press r in the batch browser to replay a dump")
            return
        gpus = f", GPUs {','.join(map(str, record.gpus))}" if record.gpus else ""
        lines = [
            f"{record.job_id} on {record.node}{gpus}: {record.state}"
            + ("" if record.exit_code is None else f" (exit {record.exit_code})")
        ]
        argv = record.command
        if argv:
            lines.append("command: " + " ".join(argv))
        if record.log:
            lines.append(f"log: {record.log}")
        if record.slurm_job:
            lines.append(record.slurm_label)
        if record.verification:
            lines.append(record.verification.summary)
        if record.error and record.state in ("unknown", "failed"):
            lines.append(record.error)
        detail.update(Text("\n").join(remote_text(line) for line in lines))

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None and event.row_key.value != self.selected:
            self.selected = event.row_key.value
            self._show_detail()
            self.action_follow()  # the log pane always tails the highlighted job

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        # The table takes enter for itself; a selected row means "follow its log".
        if event.row_key.value is not None:
            self.selected = event.row_key.value
            self.action_follow()

    @on(RunLogTail)
    def _log_tail(self, message: RunLogTail) -> None:
        if not self.fresh(message) or message.key != self._log_key:
            return
        log = self.query_one("#jobs-log", Log)
        log.clear()
        if message.error:
            record = self.records.get(message.key)
            where = record.log if record else "?"
            line = f"log unavailable ({message.error}); it is kept on the node at {where}"
            log.write_line(remote_line(line))
        else:
            log.write_lines([remote_log_line(line) for line in message.lines])

    @on(Notice)
    def _notice(self, message: Notice) -> None:
        toast(self, message.text, severity=message.severity)

    def show_job(self, node: str, job_id: str) -> None:
        """Put the cursor and the log pane on this job (one just launched) once listed."""
        self._wanted = f"{node}/{job_id}"
        if self.is_mounted:
            self.refresh_jobs()

    # actions ---------------------------------------------------------------------------
    def action_toggle_users(self) -> None:
        toast(self, f"Runs and captures shown: {self.users.toggle()}")
        self._draw()

    def action_follow(self) -> None:
        if self.selected is None:
            return
        self._log_key = self.selected
        self.follow_log(self.selected)

    @background("jobs-tail", doing="reading the job's log", retry="press enter to try again")
    def follow_log(self, ticket: Ticket, key: str) -> None:
        record = self.records.get(key)
        if record is None:
            return
        try:
            session = self.fleet.session(record.node)
        except KeyError:
            error = f"node {record.node} is not connected"
            self.post_message(RunLogTail(key, [], error, ticket=ticket))
            return
        try:
            lines = jobs.tail(session, record.job_id, TAIL_LINES)
        except Exception as exc:  # shown in the log pane, where the user looks for it
            self.post_message(
                RunLogTail(key, [], str(exc) or exc.__class__.__name__, ticket=ticket)
            )
            return
        self.post_message(RunLogTail(key, lines, ticket=ticket))

    def action_refresh(self) -> None:
        toast(self, "Asking every node for its jobs…", timeout=2)  # seen even if nothing changed
        self.refresh_jobs()

    def filter_changed(self) -> None:
        self._draw()

    def action_back(self) -> None:
        if self.close_filter():
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # In read-only mode stop is shown disabled in the footer.
        return not (action == "stop" and self.read_only)

    def action_mark(self) -> None:
        if self.selected is None:
            return
        self.marked ^= {self.selected}
        self._draw()

    def action_stop(self) -> None:
        if self.read_only:
            return
        chosen = sorted(self.marked) if self.marked else [self.selected or ""]
        running = [k for k in chosen if k in self.records and self.records[k].state == "running"]
        if not running:
            toast(self, "nothing running to stop")
            return
        if len(running) == 1:
            record = self.records[running[0]]
            command = " ".join(record.argv)
            question = f"Stop {record.job_id} on {record.node}?\n{command}"
        else:
            question = f"Stop {len(running)} jobs?\n" + "\n".join(running)

        def answered(yes: bool | None) -> None:
            if yes:
                self.marked.clear()
                for key in running:
                    self.stop_job(key)

        self.app.push_screen(ConfirmDialog(question), answered)

    @background("jobs-stop", doing="stopping a job", retry="press s to try again",
                exclusive=False)  # fmt: skip
    def stop_job(self, ticket: Ticket, key: str) -> None:
        record = self.records.get(key)
        if record is None:
            return
        try:
            jobs.stop(self.fleet.session(record.node), record)
        except Exception as exc:
            raise UserError(f"{record.job_id} on {record.node}: {exc}") from exc
        finally:
            self.app.call_from_thread(self.refresh_jobs)
        self.post_message(Notice(f"{record.job_id}: {record.state}"))

    def action_verify(self) -> None:
        if self.selected is not None:
            self.verify_run(self.selected)

    @background("jobs-verify", doing="verifying a replay", retry="press v to try again",
                exclusive=False)  # fmt: skip
    def verify_run(self, ticket: Ticket, key: str, quiet: bool = False) -> None:
        """`v` (said in a notification), or on its own for a run that just finished
        (`quiet`: the verification column says it; an old run whose recording is gone
        raises no toast each time the screen opens)."""
        record = self.records.get(key)
        if record is None:
            return
        try:
            result = jobs.verify_run(self.fleet.session(record.node), record)
        except Exception as exc:
            if quiet:
                return  # `v` on the row says why
            raise UserError(f"{record.job_id} on {record.node}: {exc}") from exc
        if quiet:
            self.app.call_from_thread(self.refresh_jobs)
            return
        if result is None:
            self.post_message(Notice(f"{record.job_id}: no metrics to verify for this template"))
            return
        self.post_message(Notice(result.summary, "information" if result.matched else "warning"))
        self.app.call_from_thread(self.refresh_jobs)
