"""The Batches screen: browse dumped rollout batches (steps x dp ranks), samples and tokens.

Left: the dump's timeline (one row per step file). Right: the selected file's summary with
AReaL's health warnings and small reward / length histograms, its sample table, and the
selected sample's tokens. Everything is read in workers through a `BatchSource`, locally
or on a node through its agent.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from areal_node import batches
from areal_node.batches import BatchError, UnsafePickleError
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable, Static

from areal_console.core.batches.formatter import figure, figure_as
from areal_console.core.batches.records import (
    BatchStats,
    BatchSummary,
    Comparison,
    Describe,
    SampleRow,
    SampleView,
    StepEntry,
    sample_rows,
)
from areal_console.core.batches.source import BatchSource, LocalBatchSource, RemoteBatchSource
from areal_console.core.common.textfmt import plural, printable
from areal_console.core.connection.fleet import Fleet
from areal_console.dialogs.trust_pickle import TrustPickleDialog
from areal_console.messages import (
    BatchCompareLoaded,
    BatchLoadFailed,
    BatchSampleLoaded,
    BatchSamplesLoaded,
    BatchSummaryLoaded,
)
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.mini_histogram import MiniHistogram
from areal_console.widgets.remote_text import remote_block, remote_text
from areal_console.widgets.token_view import TokenView
from areal_console.widgets.vim_table import VimTable, columns_for
from areal_console.workers import Ticket, WorkerHost, background

SAMPLE_COLUMNS = ("#", "group", "row", "seq", "prompt", "resp", "task_reward", "eos", "ver")
# On a narrow terminal, beside the step list (the open sample's line has these):
SAMPLE_SPARE = ("row", "seq", "prompt")
SAMPLE_SHORT = {"group": "grp", "task_reward": "reward"}

# Below this many rows the summary and the samples cannot both be usable at once.
SUMMARY_NEEDS_HEIGHT = 36
SAMPLE_WIDGETS = {"samples", "sample-view", "sample-filter"}

ReplayCallback = Callable[[str, list[int]], None]


def _stats_text(out: Text, st: BatchStats, eos: tuple[int, ...] | None) -> None:
    names = ["seq_len", "prompt_len", "response_len", "task_reward"]
    if st.reward is not None and st.reward != st.task_reward:
        names.append("reward")  # normalised rewards beside original_rewards
    # A grid 36 columns wide: it fits beside the step list in an 80-column terminal.
    out.append(f"{'':<12}{'mean':>6}{'std':>6}{'min':>6}{'max':>6}\n", style="dim")
    for name in names:
        d = st.describe(name) or Describe()
        digits = 3 if name in ("task_reward", "reward") else 1
        out.append(f"{name:<12}", style="bold")
        out.append("".join(f"{figure(v, digits):>6}" for v in (d.mean, d.std, d.min, d.max)))
        out.append("\n")
    out.append(f"{'no_eos_ratio':<13}", style="bold")
    by_eos = (
        f"  not ending in EOS {list(eos)}: {figure(st.no_eos_token_ratio, 3)}"
        if eos
        else "  (EOS id unknown)"
    )
    out.append(f"{figure(st.no_eos_ratio, 3)}{by_eos}\n")
    if st.equal_reward_group_ratio is not None:
        out.append(f"{'equal reward':<13}", style="bold")
        n = st.equal_reward_groups
        out.append(
            f"{n} group{'' if n == 1 else 's'} "
            f"({st.equal_reward_group_ratio:.0%}) with zero advantage\n"
        )
    v = st.version
    if v:
        out.append(f"{'versions':<13}", style="bold")
        out.append(
            f"{figure(v.min)}..{figure(v.max)}  staleness mean {figure_as(v.staleness_mean, '.2f')} "
            f"max {figure(v.staleness_max)}  mixed {figure_as(v.mixed_version_ratio, '.0%')}\n"
        )
    iw = st.behave_imp_weight
    if iw:
        out.append(f"{'behave_imp_w':<13}", style="bold")
        out.append(
            f"mean {figure_as(iw.mean, '.3f')}  min {figure_as(iw.min, '.3f')}  max {figure_as(iw.max, '.3f')}  "
            f"above {figure_as(iw.upper, 'g')} {figure_as(iw.above_upper_ratio, '.2%')}\n"
        )


def summary_text(s: BatchSummary) -> Text:
    """The summary pane: what the file is, its warnings, its stats."""
    out = Text()
    out.append_text(remote_text(s.description, style="bold"))
    out.append("\n")
    tokens = figure(s.tokens)  # unknown for RTensors
    where = [f"groups {figure(s.groups)}", f"samples {figure(s.samples)}", f"tokens {tokens}"]
    if s.step is not None:
        where.insert(0, f"step {s.step}" + (f" dp {s.dp_rank}" if s.dp_rank is not None else ""))
    out.append("  ".join(where) + "\n")
    # The warnings before the figures: on a short terminal they are what must show.
    for w in s.warnings:
        out.append_text(remote_text(f"! {w}", style="bold yellow"))
        out.append("\n")
    if s.stats is not None:
        _stats_text(out, s.stats, s.eos_token_ids)
    remote = s.remote
    if remote:
        out.append(f"{'RTensors':<13}", style="bold")
        nodes = ", ".join(f"{a} ({n})" for a, n in sorted(remote.nodes.items()))
        out.append(f"{figure(remote.shards)} shards on {nodes}\n")
    return out


def compare_text(c: Comparison) -> Text:
    out = Text()
    out.append_text(remote_block(f"A {printable(c.a)}\nB {printable(c.b)}\n", style="bold"))
    out.append(f"{'stat':<26}{'A':>11}{'B':>11}{'B-A':>11}\n", style="bold")
    for r in c.rows:
        delta = r.delta
        style = "" if not delta else "green" if delta > 0 else "red"
        out.append(f"{r.stat:<26}{figure(r.a, 3):>11}{figure(r.b, 3):>11}")
        out.append(f"{figure(delta, 3):>11}\n", style=style)
    return out


class BatchesScreen(FilterHost, WorkerHost, Screen[None]):
    """Browse a dump file or directory; `fleet` + `node` read it on that node."""

    BINDINGS = [
        Binding(
            "escape",
            "back",
            "Back",
            id="batches.back",
            tooltip="Clear the filter, leave the sample view, or close the screen",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="batches.filter",
            tooltip="Filter samples: text, 'noeos', 'eos', 'reward=1', 'group=3'",
        ),
        Binding(
            "space",
            "mark",
            "Mark",
            id="batches.mark",
            tooltip="Mark the highlighted step file for comparison (two at most)",
        ),
        Binding(
            "c",
            "compare",
            "Compare",
            id="batches.compare",
            tooltip="Compare the two marked step files side by side",
        ),
        Binding(
            "t",
            "trust",
            "Trust pickle",
            id="batches.trust",
            tooltip="Reload allowing pickled code (asks first; for files you trust)",
        ),
        Binding(
            "l",
            "logprobs",
            "Logprobs",
            id="batches.logprobs",
            tooltip="Show each completion token's logprob in the sample view",
        ),
        Binding(
            "r",
            "request_replay",
            "Replay",
            id="batches.replay",
            tooltip="Replay the marked steps (or the highlighted one) on the node that holds the dump",
        ),
        Binding(
            "f5",
            "reload",
            "Reload",
            id="batches.reload",
            tooltip="Read the dump again (new steps, changed files)",
        ),
    ]

    class ReplayRequested(Message):
        """Someone asked to replay steps of this dump (the app's replay dialog handles it)."""

        def __init__(self, path: str, steps: list[int], node: str | None) -> None:
            super().__init__()
            self.path = path
            self.steps = steps
            self.node = node

    def __init__(
        self,
        path: str,
        fleet: Fleet | None = None,
        node: str | None = None,
        *,
        source: BatchSource | None = None,
        eos_token_id: int | None = None,
        on_replay_requested: ReplayCallback | None = None,
        name: str | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id)
        self.path = path
        self.node = node
        if source is None:
            if fleet is not None and node is not None:
                source = RemoteBatchSource(fleet.session(node))
            else:
                source = LocalBatchSource()
        self.source = source
        self.eos_token_id = eos_token_id
        self.on_replay_requested = on_replay_requested
        self.trust_pickle = False
        self.top_summary: BatchSummary | None = None
        self.file_summary: BatchSummary | None = None
        self.entries: list[StepEntry] = []  # one per row of the steps table
        self.current_file: str | None = None
        self.marked: list[str] = []
        self.sample_rows: list[SampleRow] = []
        self.text_filter = ""
        self.last_error: str | None = None

    # layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="batches-body"):
            with Vertical(id="steps-pane"):
                yield Static("steps x dp ranks", classes="pane-title")
                yield VimTable(id="steps", cursor_type="row", zebra_stripes=True)
            with Vertical(id="detail-pane"):
                with VerticalScroll(id="summary-pane"):
                    yield Static("", id="summary")
                yield MiniHistogram("task_reward", digits=2, id="reward-hist")
                yield MiniHistogram("response len", digits=0, id="length-hist")
                yield FilterInput(
                    "filter samples: text, noeos, eos, task_reward=1, group=3",
                    id="sample-filter",
                    back_to="#samples",
                )
                yield VimTable(id="samples", cursor_type="row", zebra_stripes=True)
                with VerticalScroll(id="sample-pane"):
                    yield TokenView(id="sample-view")
        yield Static("", id="batches-status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        steps = self.query_one("#steps", DataTable)
        steps.add_column("✓", key="mark", width=1)
        for label, key in (
            ("step", "step"),
            ("dp", "dp"),
            ("n", "samples"),
            ("resp", "resp"),
            ("reward", "reward"),  # the mean task_reward (AReaL's name) of the file
            ("no_eos", "no_eos"),
        ):
            steps.add_column(label, key=key)
        self._sample_columns()
        # Keys go to the step list first, and tab goes straight on to the samples: the
        # summary box above them scrolls with the mouse but takes no focus.
        self.query_one("#summary-pane").can_focus = False
        steps.focus()
        # The first read of a dump takes a second or more (torch's import, the files' index):
        # loading, not blank panes.
        steps.loading = True
        self._status(f"reading {self.path}…")
        self.load_top()

    # layout at small heights ------------------------------------------------------
    def watch_focused(self, _focused: Widget | None) -> None:
        self._fit_to_height()

    def on_resize(self, _event: events.Resize) -> None:
        self._fit_to_height()
        if self._sample_columns():
            self._fill_samples()

    def _sample_columns(self) -> bool:
        """The sample table's columns for the terminal's width; whether they changed."""
        columns = [(key, key) for key in SAMPLE_COLUMNS]
        wanted = columns_for(self.app.size.width, columns, SAMPLE_SPARE, SAMPLE_SHORT)
        return self.query_one("#samples", VimTable).show_columns(wanted)

    def _fit_to_height(self) -> None:
        """On a short terminal, working in the samples hides the step's summary and
        histograms, so the sample table and the open sample get the rows (back on the steps,
        the summary returns)."""
        focused = self.focused
        in_samples = focused is not None and (
            focused.id in SAMPLE_WIDGETS or any(a.id == "sample-pane" for a in focused.ancestors)
        )
        self.set_class(self.size.height < SUMMARY_NEEDS_HEIGHT and in_samples, "samples-first")

    # status -----------------------------------------------------------------------
    def _status(self, text: str, error: bool = False) -> None:
        where = f"[{self.source.where}] " if self.source.where != "local" else ""
        widget = self.query_one("#batches-status", Static)
        widget.update(Text(where + text, style="bold red" if error else "dim"))

    def on_vim_table_at_edge(self, message: VimTable.AtEdge) -> None:
        message.stop()
        self._status(message.text)

    # workers ------------------------------------------------------------------------
    def _opts(self) -> dict[str, Any]:
        return {"eos_token_id": self.eos_token_id, "trust_pickle": self.trust_pickle}

    @background("batches-top", doing="reading the dump", retry="press f5 to read it again")
    def load_top(self, ticket: Ticket) -> None:
        try:
            summary = BatchSummary.from_json(self.source.summary(self.path, **self._opts()))
        except BatchError as exc:
            self.post_message(
                BatchLoadFailed(
                    self.path, str(exc), isinstance(exc, UnsafePickleError), ticket=ticket
                )
            )
            return
        self.post_message(BatchSummaryLoaded(summary, top=True, ticket=ticket))

    @background(
        "batches-file", doing="reading the step file", retry="press enter on the step to try again"
    )
    def load_file(self, ticket: Ticket, path: str) -> None:
        try:
            summary = BatchSummary.from_json(self.source.summary(path, **self._opts()))
            if summary.format not in batches.BATCH_FORMATS:
                self.post_message(BatchSummaryLoaded(summary, top=False, ticket=ticket))
                return
            self.post_message(BatchSummaryLoaded(summary, top=False, ticket=ticket))
            if summary.format == batches.TRAJECTORY_REFS:
                # Shapes only: the summary says where the data went; no samples to list.
                self.post_message(BatchSamplesLoaded((), ticket=ticket))
                return
            rows = sample_rows(self.source.samples(path, **self._opts()))
        except BatchError as exc:
            self.post_message(
                BatchLoadFailed(path, str(exc), isinstance(exc, UnsafePickleError), ticket=ticket)
            )
            return
        self.post_message(BatchSamplesLoaded(rows, ticket=ticket))

    @background(
        "batches-sample", doing="reading the sample", retry="press enter on the sample to try again"
    )
    def load_sample(self, ticket: Ticket, path: str, index: int) -> None:
        try:
            view = SampleView.from_json(self.source.sample(path, index, **self._opts()))
        except BatchError as exc:
            self.post_message(
                BatchLoadFailed(path, str(exc), isinstance(exc, UnsafePickleError), ticket=ticket)
            )
            return
        self.post_message(BatchSampleLoaded(view, ticket=ticket))

    @background(
        "batches-compare", doing="comparing the two steps", retry="mark them and compare again"
    )
    def load_compare(self, ticket: Ticket, a: str, b: str) -> None:
        try:
            result = batches.compare(
                self.source.summary(a, **self._opts()), self.source.summary(b, **self._opts())
            )
        except BatchError as exc:
            self.post_message(
                BatchLoadFailed(b, str(exc), isinstance(exc, UnsafePickleError), ticket=ticket)
            )
            return
        self.post_message(BatchCompareLoaded(Comparison.from_json(result), ticket=ticket))

    # message handlers ---------------------------------------------------------------
    def _file_path(self, entry: StepEntry) -> str:
        return posixpath.join(self.path, entry.file) if entry.file else self.path

    @on(BatchSummaryLoaded)
    def _summary_loaded(self, message: BatchSummaryLoaded) -> None:
        if not self.fresh(message):
            return  # answers an older request
        s = message.summary
        if message.top:
            self.query_one("#steps").loading = False
            self.top_summary = s
            self._fill_steps(s)
            if self.entries:
                start = len(self.entries) - 1
                self.query_one("#steps", DataTable).move_cursor(row=start)
                self._open_entry(start)
            return
        self.query_one("#summary-pane").loading = False
        self.file_summary = s
        self.query_one("#summary", Static).update(summary_text(s))
        self.query_one("#reward-hist", MiniHistogram).show(s.task_reward_hist)
        self.query_one("#length-hist", MiniHistogram).show(s.response_len_hist)
        if s.format not in batches.BATCH_FORMATS:
            self.query_one("#samples").loading = False
            self._status(f"{s.path} is not a rollout batch: {s.description}", error=True)
        else:
            self._status(f"{s.path}: {plural(len(s.warnings), 'warning')}")

    def _fill_steps(self, s: BatchSummary) -> None:
        table = self.query_one("#steps", DataTable)
        table.clear()
        if s.format == batches.TRAJECTORY_DIR:
            self.entries = list(s.timeline)
        else:
            self.entries = [s.as_step()]
        for i, e in enumerate(self.entries):
            table.add_row(
                "",
                figure(e.step),
                figure(e.dp_rank),
                Text("error", style="red") if e.error else figure(e.samples),
                figure(e.response_len_mean, 0),
                figure(e.task_reward_mean, 2),
                figure(e.no_eos_ratio, 3),
                key=str(i),
            )

    def _open_entry(self, row: int) -> None:
        if not 0 <= row < len(self.entries):
            return
        entry = self.entries[row]
        path = self._file_path(entry)
        self.current_file = path
        if self.top_summary is not None and self.top_summary.format == batches.TEXT_ROLLOUT:
            cached = self.new_ticket("batches-cached")  # already read: shown at once
            self.post_message(BatchSummaryLoaded(self.top_summary, top=False, ticket=cached))
        else:
            self.query_one("#summary-pane").loading = True
        self.query_one("#samples").loading = True
        self._status(f"loading {path} ...")
        self.load_file(path)

    @on(BatchSamplesLoaded)
    def _samples_loaded(self, message: BatchSamplesLoaded) -> None:
        if not self.fresh(message):
            return  # answers an older request
        self.sample_rows = list(message.rows)
        self.query_one("#samples").loading = False
        self._fill_samples()

    def _fill_samples(self) -> None:
        table = self.query_one("#samples", DataTable)
        table.clear()
        keys = self.query_one("#samples", VimTable).column_keys
        for r in filter_rows(self.sample_rows, self.text_filter):
            eos = r.ends_in_eos  # AReaL's rule when no EOS id is known
            cells = {
                "#": str(r.index),
                "group": figure(r.group),
                "row": figure(r.row),
                "seq": figure(r.seq_len),
                "prompt": figure(r.prompt_len),
                "resp": figure(r.response_len),
                "task_reward": figure(r.task_reward, 2),
                "eos": "-" if eos is None else "yes" if eos else Text("NO", style="bold red"),
                "ver": f"{figure(r.head_version)}..{figure(r.tail_version)}",
            }
            table.add_row(*(cells[k] for k in keys), key=str(r.index))

    @on(BatchSampleLoaded)
    def _sample_loaded(self, message: BatchSampleLoaded) -> None:
        if not self.fresh(message):
            return  # answers an older request
        self.query_one("#sample-pane").loading = False
        self.query_one("#sample-view", TokenView).show(message.view)

    @on(BatchCompareLoaded)
    def _compare_loaded(self, message: BatchCompareLoaded) -> None:
        if not self.fresh(message):
            return  # answers an older request
        self.query_one("#summary-pane").loading = False
        self.query_one("#summary", Static).update(compare_text(message.result))
        self._status("comparing two steps: enter on a step goes back to its summary")

    @on(BatchLoadFailed)
    def _load_failed(self, message: BatchLoadFailed) -> None:
        if not self.fresh(message):
            return  # answers an older request
        for selector in ("#steps", "#summary-pane", "#samples", "#sample-pane"):
            self.query_one(selector).loading = False
        error = message.error.replace(
            batches.TRUST_HINT, "press t to load it anyway, only if you trust who wrote it"
        )
        self.last_error = error
        self._status(error, error=True)
        self.query_one("#summary", Static).update(Text(error, style="bold red"))
        if message.unsafe and not self.trust_pickle:
            self._ask_trust(message.path, message.error)

    # actions ------------------------------------------------------------------------
    @on(DataTable.RowSelected, "#steps")
    def _step_selected(self, event: DataTable.RowSelected) -> None:
        self._open_entry(event.cursor_row)

    @on(DataTable.RowSelected, "#samples")
    def _sample_selected(self, event: DataTable.RowSelected) -> None:
        if self.current_file is None or event.row_key.value is None:
            return
        self.query_one("#sample-pane").loading = True
        self.load_sample(self.current_file, int(event.row_key.value))

    def filter_changed(self) -> None:
        self._fill_samples()

    def action_back(self) -> None:
        if self.close_filter():
            return
        if (
            self.query_one("#sample-view", TokenView).has_focus
            or self.query_one("#sample-pane").has_focus_within
        ):
            self.query_one("#samples", DataTable).focus()
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def action_mark(self) -> None:
        table = self.query_one("#steps", DataTable)
        row = table.cursor_row
        if not 0 <= row < len(self.entries):
            return
        path = self._file_path(self.entries[row])
        if path in self.marked:
            self.marked.remove(path)
        else:
            self.marked.append(path)
            if len(self.marked) > 2:
                self.marked.pop(0)
        for i, e in enumerate(self.entries):
            mark = "✓" if self._file_path(e) in self.marked else ""
            table.update_cell(str(i), "mark", mark)
        self._status(
            f"{len(self.marked)} marked" + (": c compares them" if len(self.marked) == 2 else "")
        )

    def action_compare(self) -> None:
        if len(self.marked) != 2:
            self._status("mark two step files with space first", error=True)
            return
        self.query_one("#summary-pane").loading = True
        self.load_compare(self.marked[0], self.marked[1])

    def action_trust(self) -> None:
        target = self.current_file or self.path
        self._ask_trust(target, self.last_error or f"{target}: load allowing pickled code")

    def _ask_trust(self, path: str, reason: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.trust_pickle = True
                self._status("loading with pickled code allowed", error=True)
                self.action_reload()

        self.app.push_screen(TrustPickleDialog(path, reason), answered)

    def action_logprobs(self) -> None:
        self.query_one("#sample-view", TokenView).toggle_detail()

    def action_reload(self) -> None:
        self.query_one("#summary-pane").loading = True
        self.load_top()

    def action_request_replay(self) -> None:
        """Ask the app to replay the marked steps (or the highlighted one); no key bound here.
        Not while the dump is still being read: no step is chosen then, and an empty choice
        would replay every step."""
        if self.top_summary is None:
            self._status(f"still reading {self.path}: replay once its steps are listed", error=True)
            return
        steps = [
            e.step for e in self.entries if self._file_path(e) in self.marked and e.step is not None
        ]
        if not steps:
            row = self.query_one("#steps", DataTable).cursor_row
            if 0 <= row < len(self.entries) and (step := self.entries[row].step) is not None:
                steps = [step]
        steps = sorted(set(steps))
        self.post_message(self.ReplayRequested(self.path, steps, self.node))
        if self.on_replay_requested is not None:
            self.on_replay_requested(self.path, steps)


def filter_rows(rows: list[SampleRow], text: str) -> list[SampleRow]:
    """Sample rows matching a filter: `noeos`, `eos`, `key=value` terms, or plain text."""
    terms = text.split()
    if not terms:
        return rows
    out = []
    for r in rows:
        ok = True
        for term in terms:
            if term in ("noeos", "eos"):
                # By the EOS id when known, else AReaL's rule (length == padded width).
                cut = r.ends_in_eos is False
                ok = cut if term == "noeos" else not cut
            elif "=" in term:
                key, _, value = term.partition("=")
                have = r.value(key)
                try:
                    ok = have is not None and float(have) == float(value)
                except ValueError:
                    ok = str(have) == value
            else:
                ok = any(term in v for v in r.text_values)
            if not ok:
                break
        if ok:
            out.append(r)
    return out
