"""The Stacks screen: diagnosis, rank groups, the merged tree and side-by-side diffs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label, Static

from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import plural
from areal_console.core.rollout.perf_trace import phase_summary
from areal_console.core.stacks.coverage import capture_coverage
from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.core.stacks.diff import diff_stacks
from areal_console.core.stacks.merge import StackAnalysis, analyse, group_name, thread_trees
from areal_console.core.stacks.records import Frame, StackCapture, variables_at
from areal_console.core.stacks.report import (
    AnalysedCapture,
    capture_json,
    full_diagnosis,
    source_summary,
    taken_by,
    text_report,
)
from areal_console.core.stacks.store import save_capture, write_atomic
from areal_console.dialogs.report_preview import followed_log, report_preview_for
from areal_console.dialogs.source_view import SourceViewScreen
from areal_console.messages import (
    StacksAnalysed,
    StacksCaptureFailed,
    StacksExported,
    StackTreesReady,
)
from areal_console.widgets.console_footer import ConsoleFooter
from areal_console.widgets.diagnosis_banner import DiagnosisBanner
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.ledger_pane import LedgerPane
from areal_console.widgets.rank_group_table import RankGroupTable
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.stack_diff import StackDiffView
from areal_console.widgets.stack_tree import StackTree
from areal_console.widgets.vim_table import VimTable
from areal_console.workers import Ticket, WorkerHost, background

# A new capture, or one already analysed (a live capture is analysed as it is saved).
if TYPE_CHECKING:
    from areal_console.core.stacks.capture import CaptureState

CaptureFn = Callable[[], StackCapture | AnalysedCapture]


DIFFING_GROUPS_WIDTH = 37  # the groups pane beside an open diff, border included


class StacksScreen(FilterHost, WorkerHost, Screen[None]):
    """One capture, analysed. Give it a `StackCapture`, or a `recapture` callable that
    takes (and saves) a new one; `r` calls it again. All analysis runs in workers."""

    # Under 100 columns a diff takes the whole width (its title names both groups).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]

    BINDINGS = [
        Binding(
            "space",
            "mark",
            "Mark",
            id="stacks.mark",
            tooltip="Mark the highlighted group for a diff (two at most)",
        ),
        Binding(
            "d",
            "diff",
            "Diff",
            id="stacks.diff",
            tooltip="Side-by-side diff of the two marked groups (or marked vs highlighted)",
        ),
        Binding(
            "right_square_bracket",
            "next_difference",
            "Next diff",
            id="stacks.next_diff",
            tooltip="Jump to the next differing frame in the diff",
        ),
        Binding(
            "left_square_bracket",
            "prev_difference",
            "Prev diff",
            id="stacks.prev_diff",
            tooltip="Jump to the previous differing frame in the diff",
        ),
        Binding(
            "number_sign",
            "goto_rank",
            "Go to rank",
            id="stacks.goto",
            tooltip="Jump to the group holding a rank number",
        ),
        Binding(
            "j",
            "next_group",
            "Next group",
            id="stacks.next_group",
            show=False,
            tooltip="Highlight the next group",
        ),
        Binding(
            "k",
            "prev_group",
            "Prev group",
            id="stacks.prev_group",
            show=False,
            tooltip="Highlight the previous group",
        ),
        Binding(
            "enter",
            "drill",
            "Show in tree",
            id="stacks.drill",
            show=False,
            tooltip="Show the highlighted group's stack in the merged tree",
        ),
        Binding(
            "t",
            "toggle_threads",
            "All threads",
            id="stacks.threads",
            tooltip="Merged tree of the main thread only, or of every thread",
        ),
        Binding(
            "i",
            "toggle_idle",
            "Idle threads",
            id="stacks.idle",
            tooltip="Show or hide idle threads (waiting pool workers, queues)",
        ),
        Binding(
            "o",
            "open_source",
            "Source",
            id="stacks.source",
            tooltip="Show the source lines around the highlighted frame",
        ),
        Binding(
            "f",
            "toggle_diagnosis",
            "Full diagnosis",
            id="stacks.full_diagnosis",
            tooltip="The diagnosis in full (wrapped, every piece of evidence and advice), or "
            "one line each again",
        ),
        Binding(
            "N",
            "toggle_capture('native')",
            "Native frames",
            id="stacks.native",
            show=False,
            tooltip="Capture again with C/C++ frames too (py-spy --native: NCCL under a "
            "collective), or without them",
        ),
        Binding(
            "L",
            "toggle_capture('locals')",
            "Locals",
            id="stacks.locals",
            show=False,
            tooltip="Capture again with each frame's local variables (py-spy --locals), or "
            "without; o on a frame shows them",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            id="stacks.filter",
            tooltip="Filter groups by ranks (0-15,4095), node:NAME, role:ROLE, function or file",
        ),
        Binding(
            "e",
            "export",
            "Export",
            id="stacks.export",
            tooltip="Write the plain-text report and JSON next to the saved capture",
        ),
        Binding(
            "F",
            "recorder_setup",
            "Recorder setup",
            id="stacks.recorder_setup",
            tooltip="How to turn the Flight Recorder on (hook line, AReaL config block)",
        ),
        Binding(
            "b",
            "bug_report",
            "Bug report",
            id="stacks.report",
            tooltip="A bug report for AReaL's issue tracker from this capture (logs, versions, "
            "config; secrets masked): preview, then w writes it and its bundle",
        ),
        Binding(
            "r",
            "recapture",
            "Recapture",
            id="stacks.recapture",
            tooltip="Take (and save) a new capture of every rank",
        ),
        Binding(
            "escape",
            "back",
            "Back",
            id="stacks.back",
            tooltip="Close the prompt or the diff, clear the filter, or go back",
        ),
    ]

    class CaptureProgress(Message):
        """Dumps finished so far (posted from the capture's thread as each rank is done)."""

        def __init__(self, done: int, total: int, failed: int) -> None:
            super().__init__()
            self.done, self.total, self.failed = done, total, failed

    def __init__(
        self,
        capture: StackCapture | None = None,
        *,
        recapture: CaptureFn | None = None,
        state: CaptureState | None = None,
        name: str | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id)
        if capture is None and recapture is None:
            raise ValueError("StacksScreen needs a capture or a recapture callable")
        self.capture = capture
        self.recapture = recapture
        self.state = state  # the console's capture options, which N and L change
        self.analysis: StackAnalysis | None = None
        self.diagnosis: Diagnosis | None = None
        self.marked: list[int] = []
        self.text_filter = ""
        self.all_threads = False
        self.show_idle = False
        self.diffing: tuple[int, int] | None = None

    # layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield DiagnosisBanner("analysing…", id="diagnosis")
        with Horizontal(id="stacks-body"):
            with Vertical(id="groups-box"):
                yield Label("Groups", classes="pane-title", id="groups-title")
                yield RankGroupTable(id="groups")
                yield Label(
                    "Collectives (Flight Recorder)", classes="pane-title", id="ledger-title"
                )
                yield LedgerPane(id="ledger")
            with Vertical(id="detail-box"):
                yield Label("Merged stacks (main thread)", classes="pane-title", id="detail-title")
                yield StackTree(id="tree")
                yield StackDiffView(id="diff")
        yield FilterInput(
            "filter groups: ranks (0-15,4095), node:NAME, role:ROLE, function or file",
            id="filter",
            back_to="#groups",
            hide_on_enter=True,  # the status line shows the filter
        )
        yield Input(placeholder="go to rank: a number, e.g. 17", id="prompt")
        yield Static("", id="status")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one("#prompt", Input).display = False
        self.query_one(StackDiffView).display = False
        if self.capture is not None:
            self._analyse(self.capture)
        else:
            self.action_recapture()

    def say(self, text: str) -> None:
        self.query_one("#status", Static).update(remote_text(text))

    def on_vim_table_at_edge(self, message: VimTable.AtEdge) -> None:
        message.stop()
        self.say(message.text)

    # workers: never touch widgets, only post messages --------------------------------
    @background("stacks-analyse", doing="analysing the capture", retry="press r to capture again")
    def _analyse(self, ticket: Ticket, capture: StackCapture) -> None:
        analysis = analyse(capture)
        self.post_message(StacksAnalysed(analysis, full_diagnosis(analysis), ticket=ticket))

    @background(
        "stacks-capture", doing="capturing every rank's stack", retry="press r to capture again"
    )
    def _capture(self, ticket: Ticket) -> None:
        if self.recapture is None:
            raise UserError("this Stacks screen shows a saved capture: nothing to recapture")
        try:
            capture = self.recapture()
        except Exception as exc:  # shown to the user; the screen keeps working
            self.post_message(
                StacksCaptureFailed(str(exc) or exc.__class__.__name__, ticket=ticket)
            )
            return
        if isinstance(capture, AnalysedCapture):  # analysed when it was saved: not again
            self.post_message(StacksAnalysed(capture.analysis, capture.diagnosis, ticket=ticket))
            return
        analysis = analyse(capture)
        self.post_message(StacksAnalysed(analysis, full_diagnosis(analysis), ticket=ticket))

    @background("stacks-trees", doing="merging every thread's stacks", retry="press t to try again")
    def _build_threads(self, ticket: Ticket, capture: StackCapture, include_idle: bool) -> None:
        self.post_message(StackTreesReady(thread_trees(capture, include_idle), True, ticket=ticket))

    @background("stacks-export", doing="exporting the report", retry="press e to try again")
    def _export(self, ticket: Ticket, analysis: StackAnalysis, diagnosis: Diagnosis) -> None:
        capture = analysis.capture
        try:
            # The same file when it was saved already; from this analysis, not a new one.
            doc = capture_json(capture, analysis, diagnosis)
            json_path = save_capture(capture, doc=doc)
            text_path = json_path.with_suffix(".txt")
            write_atomic(text_path, text_report(capture, analysis, diagnosis))
        except OSError as exc:
            self.post_message(StacksExported(f"export failed: {exc}", ticket=ticket))
            return
        self.post_message(
            StacksExported(f"exported {text_path} and {json_path.name}", ticket=ticket)
        )

    # results --------------------------------------------------------------------------
    @on(StacksAnalysed)
    def _analysed(self, message: StacksAnalysed) -> None:
        if not self.fresh(message):
            return  # answers an older request
        self.analysis, self.diagnosis = message.analysis, message.diagnosis
        self.capture = message.analysis.capture
        self.marked, self.diffing = [], None
        self.query_one(DiagnosisBanner).show(message.diagnosis)
        capture = self.capture
        self.query_one(LedgerPane).show(
            capture.ledger, message.diagnosis.wait_for, capture.nccl_ras
        )
        self._show_groups()
        self._show_trees()
        self._close_diff()
        self._say_summary()

    @on(StackTreesReady)
    def _trees_ready(self, message: StackTreesReady) -> None:
        if not self.fresh(message):
            return  # answers an older request
        if message.all_threads != self.all_threads or self.analysis is None:
            return  # the user toggled back meanwhile
        self.query_one(StackTree).show_tree(
            message.trees, len(self.analysis.tree.ranks), by_thread=True
        )
        self._set_detail_title()

    @on(StacksExported)
    def _exported(self, message: StacksExported) -> None:
        if not self.fresh(message):
            return  # answers an older request
        self.say(message.text)

    def on_stacks_screen_capture_progress(self, message: CaptureProgress) -> None:
        text = f"capturing: {message.done}/{message.total} ranks dumped"
        if message.failed:
            text += f", {message.failed} failed"
        self.say(text + "…")
        if self.analysis is None:
            self.query_one(DiagnosisBanner).update(remote_text(text + "…"))

    @on(StacksCaptureFailed)
    def _capture_failed(self, message: StacksCaptureFailed) -> None:
        if not self.fresh(message):
            return  # answers an older request
        if self.analysis is None:
            self.query_one(DiagnosisBanner).update(remote_text(f"capture failed: {message.error}"))
        self.say(f"capture failed: {message.error}")

    def _say_summary(self) -> None:
        analysis, capture = self.analysis, self.capture
        if analysis is None or capture is None:
            return
        ranks = capture.rank_stacks
        others = sum(1 for r in capture.ranks if r.rank is None)
        failed = sum(1 for r in ranks if r.state != "ok")
        parts = [plural(len(ranks), "rank"), plural(len(analysis.groups), "group")]
        if analysis.world_size:
            parts[0] += f" of {analysis.world_size}"
        # A watch's capture: its tag and its report first (a narrow terminal cuts the end).
        if taken := taken_by(capture, os.path.expanduser("~")):
            parts.insert(0, taken)
        if analysis.missing:
            parts.append(f"{len(analysis.missing)} missing")
        if failed:
            parts.append(f"{failed} not captured")
        if others:
            parts.append(plural(others, "other job process", "other job processes"))
        if capture.errors:  # the coverage line's failed nodes, with their reasons
            parts.append(capture_coverage(capture).line().partition("; ")[2])
        if any(r.source == "worker_server" for r in ranks):  # py-spy's, unless said
            parts.append(f"stacks from {source_summary(ranks)}")
        parts.append(capture.save_error or f"capture {capture.capture_id or 'unsaved'}")
        phases = phase_summary([(r.rank, r.phase) for r in ranks if r.rank is not None and r.phase])
        if phases:
            parts.append(phases)
        if self.text_filter:
            parts.append(f"filter: {self.text_filter!r}")
        self.say(" · ".join(parts))

    def _show_groups(self) -> None:
        if self.analysis is None:
            return
        table = self.query_one(RankGroupTable)
        table.show_groups(self.analysis.groups, self.marked, self.text_filter)
        self._groups_title()
        self.call_after_refresh(self._groups_title)  # once the table has its height

    def _groups_title(self) -> None:
        """`Groups (shown of all)`, and how many rows are below the pane's edge."""
        if self.analysis is None or not self.is_attached:
            return  # (called after a refresh: the screen may be closed by then)
        table = self.query_one(RankGroupTable)
        title = f"Groups ({len(table.shown)} of {len(self.analysis.groups)})"
        below = table.rows_below() if table.size.height else 0
        self.query_one("#groups-title", Label).update(title + (f" +{below} below" if below else ""))

    def on_rank_group_table_view_changed(self, message: RankGroupTable.ViewChanged) -> None:
        message.stop()
        self.call_after_refresh(self._groups_title)  # the table's regions are final then

    def _show_trees(self) -> None:
        if self.analysis is None or self.capture is None:
            return
        if self.all_threads:
            self._build_threads(self.capture, self.show_idle)
            return
        self.query_one(StackTree).show_tree(
            {"main": self.analysis.tree}, len(self.analysis.tree.ranks)
        )
        self._set_detail_title()

    def _set_detail_title(self) -> None:
        title = self.query_one("#detail-title", Label)
        if self.diffing is not None and self.analysis is not None:
            a, b = (self.analysis.groups[i].label for i in self.diffing)
            title.update(f"Diff: ranks {a}  vs  ranks {b}   (] / [ next / previous difference)")
        elif self.all_threads:
            idle = "with" if self.show_idle else "without"
            title.update(f"Merged stacks (all threads, {idle} idle threads)")
        else:
            title.update("Merged stacks (main thread)")

    # actions --------------------------------------------------------------------------
    def _current_group(self) -> int | None:
        return self.query_one(RankGroupTable).current_group

    def action_next_group(self) -> None:
        self.query_one(RankGroupTable).action_cursor_down()

    def action_prev_group(self) -> None:
        self.query_one(RankGroupTable).action_cursor_up()

    def action_mark(self) -> None:
        index = self._current_group()
        if index is None or self.analysis is None:
            return
        if index in self.marked:
            self.marked.remove(index)
        else:
            self.marked.append(index)
            del self.marked[:-2]  # a diff has two sides: the oldest mark goes
        self.query_one(RankGroupTable).set_marks(self.marked)
        labels = [self.analysis.groups[i].label for i in self.marked]
        self.say("marked: " + (" and ".join(labels) if labels else "nothing"))

    def action_diff(self) -> None:
        if self.analysis is None:
            return
        pair = self._diff_pair()
        if pair is None and len(self.analysis.groups) < 2:
            self.say("only one group: every rank has the same stack, nothing to diff")
            return
        if pair is None:
            self.say("mark two groups with space (or one, and highlight another), then d")
            return
        a, b = (self.analysis.groups[i] for i in pair)
        diff = diff_stacks(a.frames, b.frames)
        self.diffing = pair
        view = self.query_one(StackDiffView)
        body = self.query_one("#stacks-body")
        body.add_class("-diffing")  # narrower groups pane, or none (global.tcss)
        groups_box = 0 if self.has_class("-narrow") else DIFFING_GROUPS_WIDTH
        view.show_diff(
            diff,
            f"ranks {a.label} ({a.size})",
            f"ranks {b.label} ({b.size})",
            width=body.size.width - groups_box,  # the view re-fits on its first resize
        )
        self.query_one(StackTree).display = False
        view.display = True
        view.focus()
        self._set_detail_title()
        if diff.first_difference is None:
            self.say(f"ranks {a.label} and {b.label} have identical stacks")
        else:
            row = diff.rows[diff.first_difference]
            frame = row.left or row.right
            where = frame.function if frame else "?"
            self.say(
                f"{len(diff.differences)} differing frames; first at depth "
                f"{diff.first_difference}: {where}"
            )

    def _diff_pair(self) -> tuple[int, int] | None:
        current = self._current_group()
        if len(self.marked) == 2:
            return self.marked[0], self.marked[1]
        if len(self.marked) == 1 and current is not None and current != self.marked[0]:
            return self.marked[0], current
        if not self.marked and current is not None and self.analysis is not None:
            other = 0 if current != 0 else 1  # against the largest group
            if other < len(self.analysis.groups) and other != current:
                return other, current
        return None

    def _close_diff(self) -> None:
        self.diffing = None
        self.query_one("#stacks-body").remove_class("-diffing")
        self.query_one(StackDiffView).display = False
        self.query_one(StackTree).display = True
        self._set_detail_title()

    def action_next_difference(self) -> None:
        self._jump(1)

    def action_prev_difference(self) -> None:
        self._jump(-1)

    def _jump(self, step: int) -> None:
        if self.diffing is None:
            which = "next" if step > 0 else "previous"
            self.say(f"no diff open, so no {which} difference: mark groups with space, then d")
            return
        row = self.query_one(StackDiffView).jump(step)
        if row is None:
            self.say("no more differences " + ("below" if step > 0 else "above"))

    def action_drill(self) -> None:
        index = self._current_group()
        if index is None:
            return
        if self.diffing is not None:
            self._close_diff()
        if self.all_threads:
            self.all_threads = False
            self._show_trees()
        tree = self.query_one(StackTree)
        if tree.reveal_group(index):
            tree.focus()

    def action_toggle_threads(self) -> None:
        self.all_threads = not self.all_threads
        if self.diffing is not None:
            self._close_diff()
        self._show_trees()
        self.say("all threads" if self.all_threads else "main thread only")

    def action_toggle_idle(self) -> None:
        self.show_idle = not self.show_idle
        if not self.all_threads:
            self.all_threads = True
            if self.diffing is not None:
                self._close_diff()
        self._show_trees()
        self.say(("showing" if self.show_idle else "hiding") + " idle threads")

    def _focused_frame(self) -> Frame | None:
        focused = self.focused
        if isinstance(focused, StackDiffView):
            return focused.current_frame
        if isinstance(focused, StackTree):
            return focused.current_frame
        index = self._current_group()
        if index is not None and self.analysis is not None:
            frames = self.analysis.groups[index].frames
            from areal_console.core.stacks.diagnose import call_site, collective_frame

            return call_site(frames, collective_frame(frames)) or (frames[0] if frames else None)
        return None

    def action_open_source(self) -> None:
        frame = self._focused_frame()
        if frame is None:
            self.say("no frame highlighted")
            return
        variables = variables_at(self.capture, frame) if self.capture is not None else []
        self.app.push_screen(SourceViewScreen(frame, variables=variables))

    def action_recorder_setup(self) -> None:
        """`F`: the launch hook line and the AReaL config block, to paste."""
        from areal_node.fr_hook import HOOK_DIR

        from areal_console.core.ledger.setup import recorder_setup
        from areal_console.dialogs.recorder_setup import RecorderSetupScreen

        self.app.push_screen(RecorderSetupScreen(recorder_setup(str(HOOK_DIR))))

    def action_toggle_diagnosis(self) -> None:
        full = self.query_one(DiagnosisBanner).toggle_full()
        self.say("the diagnosis in full (f: one line each)" if full else "diagnosis: one line each")

    def action_toggle_capture(self, what: str) -> None:
        """`N` / `L`: py-spy's --native / --locals on or off, then capture again."""
        if self.recapture is None or self.state is None or what not in ("native", "locals"):
            self.say("this capture was opened from disk: no live job to capture again")
            return
        value = self.state.toggle("native" if what == "native" else "locals")
        label = "native frames" if what == "native" else "local variables"
        self.say(f"capturing every rank {'with' if value else 'without'} {label}…")
        self._capture()

    def filter_changed(self) -> None:
        self._show_groups()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self) -> None:
        self._say_summary()

    def action_goto_rank(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.value = ""
        prompt.display = True
        prompt.focus()

    @on(Input.Submitted, "#prompt")
    def _prompt_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_one(RankGroupTable).focus()
        self._goto_rank(event.value.strip())

    def _goto_rank(self, text: str) -> None:
        if self.analysis is None:
            return
        if not text.isdigit():
            self.say(f"not a rank number: {text!r}")
            return
        rank = int(text)
        if rank in self.analysis.missing:
            self.say(f"rank {rank} is missing: WORLD_SIZE promises it but no node shows it")
            return
        index = self.analysis.group_of(rank)
        if index is None:
            found = self.capture.find_rank(rank) if self.capture else None
            why = f"{found.state}: {found.error}" if found else "not in this capture"
            self.say(f"rank {rank}: {why}")
            return
        table = self.query_one(RankGroupTable)
        if not table.select_group(index):
            self.set_filter("")
            self._show_groups()
            table.select_group(index)
        group = self.analysis.groups[index]
        self.say(f"rank {rank} is in group {group_name(index)}: ranks {group.label} ({group.size})")

    def action_export(self) -> None:
        if self.analysis is None or self.diagnosis is None:
            return
        self._export(self.analysis, self.diagnosis)

    def action_bug_report(self) -> None:
        if self.analysis is None or self.diagnosis is None:
            self.say("no capture analysed yet: wait for it, then press b")
            return
        analysis, diagnosis = self.analysis, self.diagnosis
        request = followed_log(self.app, analysis.capture)
        self.app.push_screen(report_preview_for(self.app, analysis, diagnosis, request))

    def action_recapture(self) -> None:
        if self.recapture is None:
            self.say("this capture was opened from disk: no live job to capture again")
            return
        self.say("capturing every rank…")
        self._capture()

    def action_back(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if prompt.display:
            prompt.display = False
            self.query_one(RankGroupTable).focus()
            self._say_summary()
            return
        if self.query_one(FilterInput).is_open:
            self.close_filter()
            self.query_one(RankGroupTable).focus()
            self._say_summary()
            return
        if self.diffing is not None:
            self._close_diff()
            self.query_one(RankGroupTable).focus()
            return
        if self.close_filter():
            self._say_summary()
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
            return
        goto = getattr(self.app, "action_goto", None)  # the console's screens are modes
        if goto is not None:
            goto("nodes")

    @on(DataTable.RowSelected, "#groups")
    def _group_selected(self, event: DataTable.RowSelected) -> None:
        # The table takes enter (and a click) for itself: selecting a group drills in.
        self.action_drill()

    @on(DataTable.RowHighlighted, "#groups")
    def _group_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.diffing is None:
            index = self._current_group()
            if index is not None:
                self.query_one(StackTree).reveal_group(index)
