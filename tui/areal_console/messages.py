"""The messages workers post back to the UI thread: small typed dataclasses, one place.

Every worker result is a `Reply` carrying the `Ticket` of the request it answers, so its
handler can drop it when a newer request of the same group was made meanwhile
(`WorkerHost.fresh`). Messages that can arrive in bursts say so with `can_replace`: only the
newest waiting one is handled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rich.text import Text
from textual.message import Message

from areal_console.core.batches.records import BatchSummary, Comparison, SampleRow, SampleView
from areal_console.core.metrics.report import HealthReport, MetricSummary
from areal_console.core.replay.runs import RunRecord
from areal_console.core.report.model import Report, ReportInputs
from areal_console.core.slurm.client import SlurmJob
from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.core.stacks.merge import StackAnalysis, TreeNode
from areal_console.core.stacks.store import SavedCapture
from areal_console.workers import Ticket

Severity = Literal["information", "warning", "error"]


@dataclass
class Reply(Message):
    """A worker's answer to one request."""

    ticket: Ticket = field(kw_only=True)


@dataclass
class Notice(Message):
    """Something to tell the user, from a worker (the UI thread shows it)."""

    text: str
    severity: Severity = "information"


# Runs screen ----------------------------------------------------------------------------


@dataclass
class RunsRefreshed(Reply):
    """Every node's jobs, merged with the console's own records."""

    records: list[RunRecord]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsRefreshed)


@dataclass
class RunLogTail(Reply):
    """The last lines of one run's log (or why they could not be read)."""

    key: str
    lines: list[str]
    error: str | None = None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunLogTail) and message.key == self.key


# Health screen --------------------------------------------------------------------------


@dataclass
class HealthPolled(Reply):
    """One poll of a run's metrics: the report and what to draw, or why there is none."""

    report: HealthReport | None
    summaries: list[MetricSummary]
    plotted: dict[str, tuple[list[int], list[float]]]
    error: str | None = None

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HealthPolled)


# App --------------------------------------------------------------------------------------


@dataclass
class SavedCapturesListed(Reply):
    """The newest saved captures, for the command palette."""

    captures: list[SavedCapture]


# Batches screen ---------------------------------------------------------------------------


@dataclass
class BatchSummaryLoaded(Reply):
    """A dump's (`top`) or one step file's summary."""

    summary: BatchSummary
    top: bool


@dataclass
class BatchSamplesLoaded(Reply):
    """One step file's sample table."""

    rows: tuple[SampleRow, ...]


@dataclass
class BatchSampleLoaded(Reply):
    """One sample, token by token."""

    view: SampleView


@dataclass
class BatchCompareLoaded(Reply):
    """Two steps side by side."""

    result: Comparison


@dataclass
class BatchLoadFailed(Reply):
    """A file that could not be read; `unsafe`: it needs pickle (ask before trusting it)."""

    path: str
    error: str
    unsafe: bool


# Stacks screen ----------------------------------------------------------------------------


@dataclass
class StacksAnalysed(Reply):
    """A capture merged into groups and trees, and its diagnosis."""

    analysis: StackAnalysis
    diagnosis: Diagnosis


@dataclass
class StackTreesReady(Reply):
    """Merged trees per thread name (the all-threads view)."""

    trees: dict[str, TreeNode]
    all_threads: bool


@dataclass
class StacksExported(Reply):
    """Where the report went, or why it did not."""

    text: str


@dataclass
class StacksCaptureFailed(Reply):
    """Taking a capture failed; the screen keeps the one it shows."""

    error: str


# Slurm jobs screen ------------------------------------------------------------------------


@dataclass
class SlurmJobsLoaded(Reply):
    """Slurm's job list."""

    jobs: list[SlurmJob]


@dataclass
class SlurmJobsFailed(Reply):
    """Why Slurm could not be asked (no squeue, the login host down, ...)."""

    error: str


# Process detail -------------------------------------------------------------------------


@dataclass
class ProcessStack(Reply):
    """One process's stack dump, rendered (or why there is none)."""

    text: Text


# Bug report ---------------------------------------------------------------------------


@dataclass
class ReportBuilt(Reply):
    """A bug report collected and masked (or why it could not be made)."""

    inputs: ReportInputs | None
    report: Report | None
    error: str = ""


@dataclass
class ReportWritten(Reply):
    """Where the report and its bundle went, or why they did not."""

    text: str
    ok: bool
