"""Which job to capture, when the nodes run several (another user's, a second experiment).

A capture pauses every process it dumps: it takes one job, never a neighbour's by default.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from areal_console.core.common.textfmt import printable
from areal_console.core.stacks.scope import JobGroup


class JobChoiceDialog(ModalScreen[str | None]):
    """Dismisses with the chosen job's key on `enter`, None on `esc`."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="job_choice.cancel", tooltip="Capture nothing"),
    ]

    def __init__(self, jobs: list[JobGroup]) -> None:
        super().__init__()
        self.jobs = jobs

    def compose(self) -> ComposeResult:
        with Vertical(id="job-choice-box"):
            yield Label(f"{len(self.jobs)} jobs on these nodes: capture which one?")
            yield OptionList(
                *(Option(printable(job.describe(self.jobs)), id=job.key) for job in self.jobs),
                id="job-choice-list",
            )
            yield Label("enter: capture this job · esc: cancel", id="job-choice-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
