"""A small dialog to launch a replay of a trajectory dump on the node that holds it.

Prefilled from the node: the dump's step range, the node's free GPUs (GPUs with no
process; "cpu" when there are none) and the exact command. Editing a field re-plans at
once (planning is pure); enter launches the job detached and dismisses with its record.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from areal_console.core.common.errors import UserError
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.core.replay.plan import (
    DumpIndex,
    LaunchTemplate,
    NoGpuError,
    ReplayPlan,
    format_gpus,
    free_gpus,
    load_templates,
    parse_gpus,
    parse_step_range,
    plan_replay,
    takes_steps,
)
from areal_console.core.replay.python import (
    PythonChoice,
    check_torch,
    choose_python,
    uses_python,
)
from areal_console.widgets.remote_text import remote_text
from areal_console.workers import Ticket, WorkerHost, background

# Below this many rows the fields lose their borders.
SHORT_TERMINAL = 32


@dataclass
class NodeFacts:
    """What the dialog learned from the node before it can plan."""

    index: DumpIndex
    sample: dict[str, Any]
    script: str
    python: PythonChoice  # the default: the agent's interpreter where it has torch


class ReplayDialog(WorkerHost, ModalScreen["jobs.RunRecord | None"]):
    """Replay `path` on `node`: GPUs, steps, extra overrides, command preview; enter launches."""

    # Opens in the field a user most likely types in; enter launches from any field (what
    # the preview shows, typed text included), tab moves between the fields. In a field,
    # enter is the field's own (Input.Submitted, below): it comes after the keys typed
    # before it. A priority binding ran ahead of them, and a burst of keys (a fast typist,
    # a paste) launched the run without the overrides just typed.
    AUTO_FOCUS = "#replay-overrides"

    BINDINGS = [
        Binding(
            "enter",
            "launch",
            "Launch",
            id="replay.launch",
            tooltip="Launch the replay detached on the node with this command",
        ),
        Binding(
            "escape",
            "cancel",
            "Cancel",
            id="replay.cancel",
            tooltip="Close the dialog without launching anything",
        ),
    ]

    class Loaded(Message):
        def __init__(self, facts: NodeFacts | None, error: str | None) -> None:
            super().__init__()
            self.facts = facts
            self.error = error

    class Launched(Message):
        def __init__(self, record: jobs.RunRecord | None, error: str | None) -> None:
            super().__init__()
            self.record = record
            self.error = error

    def __init__(
        self,
        fleet: Fleet,
        path: str,
        node: str,
        *,
        template: str = "reference",
        templates: dict[str, LaunchTemplate] | None = None,
        read_only: bool = False,
        steps: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.initial_steps = sorted(steps) if steps else None  # the steps marked in the browser
        self.fleet = fleet
        self.path = path
        self.node = node
        self.templates = templates or load_templates()
        self.template_name = template
        self.read_only = read_only
        self.facts: NodeFacts | None = None
        self.plan: ReplayPlan | None = None
        self.overrides: list[str] = []  # the user's, as the plan was made with them
        self.launching = False

    def compose(self) -> ComposeResult:
        with Vertical(id="replay-box"):
            yield Label(remote_text(f"Replay {self.path}"), id="replay-title")
            with Grid(id="replay-fields"):
                yield Label("node")
                yield Label(remote_text(self.node), id="replay-node")
                yield Label("GPUs")
                yield Input(placeholder="0,1 or cpu", id="replay-gpus")
                yield Label("steps")
                yield Input(placeholder="A:B", id="replay-steps")
                yield Label("overrides")
                yield Input(placeholder="actor.eps_clip=0.1 ...", id="replay-overrides")
                yield Label("python")
                yield Input(placeholder="the node's python with torch", id="replay-python")
            yield Static("reading the dump on the node…", id="replay-command")
            yield Label("", id="replay-device")
            yield Label("", id="replay-error")
            yield Label(
                "read-only mode: launching is disabled"
                if self.read_only
                else "enter: launch · tab: next field · esc: cancel",
                id="replay-hint",
            )

    def on_mount(self) -> None:
        self.load_node_facts()

    def on_resize(self, event: events.Resize) -> None:
        # A short terminal gets one-row fields, so the whole command preview stays in view.
        short = event.size.height < SHORT_TERMINAL
        self.set_class(short, "-short")
        for field in self.query(Input):
            field.compact = short

    # One-shot dialog work: failures are shown in the dialog itself, so these catch them.
    @background("replay-dialog-load", doing="reading the node's dump and GPUs")
    def load_node_facts(self, ticket: Ticket) -> None:
        try:
            session = self.fleet.session(self.node)
            hello = session.connect()
            index = jobs.dump_index(session, self.path)
            sample = session.call("sample")
            script = jobs.stage_trainer(session) if self.template_name == "reference" else ""
            facts = NodeFacts(index, sample, script, choose_python(hello))
            self.post_message(self.Loaded(facts, None))
        except Exception as exc:  # any failure is shown in the dialog, never raised
            self.post_message(self.Loaded(None, str(exc) or exc.__class__.__name__))

    @on(Loaded)
    def _loaded(self, message: Loaded) -> None:
        if message.error is not None or message.facts is None:
            self._show_error(f"{self.node}: {message.error}")
            self.query_one("#replay-command", Static).update("")
            return
        self.facts = message.facts
        index = message.facts.index
        try:
            plan = self._make_plan(gpus_text="", steps_text="", overrides_text="")
        except UserError:
            plan = None
        free = free_gpus(message.facts.sample)
        gpus_text = format_gpus(plan.gpus) if plan else (format_gpus(free[:1]) if free else "cpu")
        steps_text = f"{plan.steps[0]}:{plan.steps[1]}" if plan else ""
        if self.initial_steps:
            steps_text = f"{self.initial_steps[0]}:{self.initial_steps[-1]}"
        if not steps_text and index.step_numbers:
            steps_text = f"{index.step_numbers[0]}:{index.step_numbers[-1]}"
        self.query_one("#replay-gpus", Input).value = gpus_text
        self.query_one("#replay-python", Input).value = message.facts.python.path
        steps_input = self.query_one("#replay-steps", Input)
        template = self.templates.get(self.template_name)
        if template is not None and not takes_steps(template):
            # AReaL's replay has no start-step option: it always trains from global step 0.
            steps_input.value = ""
            steps_input.placeholder = "from step 0 (AReaL's replay has no start step)"
            steps_input.disabled = True
        else:
            steps_input.value = steps_text
        self.replan()

    def _python(self) -> PythonChoice:
        """The interpreter in the python field (the node's default when left empty)."""
        assert self.facts is not None
        typed = self.query_one("#replay-python", Input).value.strip()
        default = self.facts.python
        return default if not typed or typed == default.path else choose_python({}, typed)

    def _make_plan(self, gpus_text: str, steps_text: str, overrides_text: str) -> ReplayPlan:
        assert self.facts is not None
        template = self.templates.get(self.template_name)
        if template is None:
            raise UserError(f"no launch template {self.template_name!r}")
        first, last = parse_step_range(steps_text or None)
        try:
            overrides = shlex.split(overrides_text)
        except ValueError as exc:
            raise UserError(f"overrides: {exc}") from None
        self.overrides = overrides
        return plan_replay(
            self.facts.index,
            self.node,
            self.facts.sample,
            template,
            gpus=parse_gpus(gpus_text or None),
            first=first,
            last=last,
            script=self.facts.script,
            python=self._python().path,
            overrides=overrides,
        )

    @on(Input.Changed)
    def replan(self) -> None:
        if self.facts is None:
            return
        try:
            self.plan = self._make_plan(
                self.query_one("#replay-gpus", Input).value,
                self.query_one("#replay-steps", Input).value,
                self.query_one("#replay-overrides", Input).value,
            )
        except NoGpuError as exc:
            self.plan = None
            self._show_error(f"node {exc.node} has no GPUs ({exc.why}): set GPUs to cpu")
            return
        except UserError as exc:
            self.plan = None
            self._show_error(str(exc))
            return
        self._show_error("")
        self.query_one("#replay-command", Static).update(remote_text(self.plan.command_line))
        self.query_one("#replay-device", Label).update(
            remote_text(f"{self.plan.device_note} · {self._python().note}")
        )

    def _show_error(self, text: str) -> None:
        self.query_one("#replay-error", Label).update(remote_text(text))
        self.set_class(bool(text), "-error")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_launch()

    def action_launch(self) -> None:
        if self.read_only:
            self._show_error("read-only mode: launching is disabled")
            return
        if self.launching:
            return
        if self.facts is None:
            self._show_error("still reading the dump on the node: press enter once the "
                             "command shows")  # fmt: skip
            return
        self.replan()  # what the fields hold now: a key typed just before enter counts
        if self.plan is None:
            return
        self.launching = True
        self.query_one("#replay-hint", Label).update("launching…")
        self.launch_plan(self.plan, self._python())

    @background("replay-dialog-launch", doing="launching the replay", retry="press enter to retry")
    def launch_plan(self, ticket: Ticket, plan: ReplayPlan, python: PythonChoice) -> None:
        try:
            session = self.fleet.session(plan.node)
            template = self.templates.get(self.template_name)
            if template is not None and uses_python(template):
                check_torch(session, python)  # a clear error here, not in the log
            record = jobs.launch(session, plan, overrides=self.overrides)
            self.post_message(self.Launched(record, None))
        except Exception as exc:
            self.post_message(self.Launched(None, str(exc) or exc.__class__.__name__))

    @on(Launched)
    def _launched(self, message: Launched) -> None:
        self.launching = False
        if message.record is None:
            self._show_error(f"launch failed: {message.error}")
            self.query_one("#replay-hint", Label).update(
                "enter: retry · tab: next field · esc: cancel"
            )
            return
        self.dismiss(message.record)

    def action_cancel(self) -> None:
        self.dismiss(None)
