"""The bug report, previewed before it is written: collected in a worker (log tails,
config, versions from the nodes), shown masked as it will be written; `w` writes it and
its bundle, `a` switches anonymizing, esc leaves without writing."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from areal_console.core.common.textfmt import printable
from areal_console.core.connection.fleet import Fleet
from areal_console.core.metrics.locate import HealthTarget
from areal_console.core.report.bundle import (
    DEFAULT_MAX_MB,
    build_report,
    default_report_name,
    write_report,
)
from areal_console.core.report.collect import CaptureSource, ReportRequest, collect
from areal_console.core.report.model import Report, ReportInputs
from areal_console.core.report.redact import Redactor, learn_identities
from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.core.stacks.merge import StackAnalysis
from areal_console.core.stacks.records import StackCapture
from areal_console.core.stacks.report import capture_json
from areal_console.messages import ReportBuilt, ReportWritten
from areal_console.toast import toast
from areal_console.workers import Ticket, WorkerHost, background


class ReportPreview(WorkerHost, ModalScreen[None]):
    """Collects, shows and (on `w`) writes a bug report for `request`."""

    BINDINGS = [
        Binding("w", "write", "Write", id="report.write",
                tooltip="Write the report (.md) and its bundle (.tar.gz) to the directory shown"),
        Binding("a", "toggle_anonymize", "Anonymize", id="report.anonymize",
                tooltip="Also replace host names, IPs and user names in the report, or not"),
        Binding("escape", "cancel", "Cancel", id="report.cancel",
                tooltip="Close the preview without writing anything"),
    ]  # fmt: skip

    def __init__(
        self,
        fleet: Fleet | None,
        request: ReportRequest,
        directory: Path | None = None,
        max_bytes: int = int(DEFAULT_MAX_MB * 2**20),
        take_capture: CaptureSource | None = None,
    ) -> None:
        super().__init__()
        self.fleet = fleet
        self.request = request
        self.take_capture = take_capture
        self.directory = directory or Path.cwd()
        self.max_bytes = max_bytes
        self.anonymize = False
        self.inputs: ReportInputs | None = None
        self.report: Report | None = None
        self.written: Path | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="report-box"):
            yield Label(self._title(), id="report-title")
            with VerticalScroll(id="report-scroll"):
                yield Static("collecting logs, config and versions from the nodes…",
                             id="report-text", markup=False)  # fmt: skip
            yield Label("", id="report-status")

    def _title(self) -> str:
        masked = "secrets masked; hosts, IPs and users anonymized" if self.anonymize else (
            "secrets masked"
        )  # fmt: skip
        return f"Bug report for AReaL's issue tracker (preview; {masked})"

    def on_mount(self) -> None:
        self._build(None)

    # workers: never touch widgets -------------------------------------------------------
    @background("report-build", doing="making the bug report", retry="press esc and try again")
    def _build(self, ticket: Ticket, inputs: ReportInputs | None) -> None:
        if inputs is None:
            inputs = collect(self.fleet, self.request, self.take_capture)
        redactor = Redactor(anonymize=self.anonymize)
        if self.anonymize:
            learn_identities(redactor, inputs)
        self.post_message(ReportBuilt(inputs, build_report(inputs, redactor, self.max_bytes),
                                      ticket=ticket))  # fmt: skip

    @background("report-write", doing="writing the bug report", retry="press w to try again")
    def _write(self, ticket: Ticket, report: Report, path: Path) -> None:
        try:
            bundle, size = write_report(report, str(path))
        except OSError as exc:
            self.post_message(ReportWritten(f"not written: {exc}", False, ticket=ticket))
            return
        self.post_message(ReportWritten(f"wrote {path} and {bundle} ({size} bytes)", True,
                                        ticket=ticket))  # fmt: skip

    # results --------------------------------------------------------------------------
    @on(ReportBuilt)
    def _built(self, message: ReportBuilt) -> None:
        if not self.fresh(message) or message.report is None:
            return
        self.inputs, self.report = message.inputs, message.report
        # Line by line: printable() escapes a newline, and the preview shows the lines.
        lines = (printable(line) for line in message.report.markdown.splitlines())
        self.query_one("#report-text", Static).update(Text("\n".join(lines)))
        self._say()

    def _say(self) -> None:
        report = self.report
        if report is None:
            return
        parts = [f"w: write to {self.directory}", "a: anonymize", "esc: close"]
        if report.missing:
            parts.insert(0, "not collected: " + ", ".join(report.missing))
        if report.cut:
            parts.insert(0, f"{len(report.cut)} part(s) cut to fit the bundle's bound")
        self.query_one("#report-status", Label).update(Text(printable(" · ".join(parts))))

    @on(ReportWritten)
    def _was_written(self, message: ReportWritten) -> None:
        if not self.fresh(message):
            return
        toast(self, printable(message.text), severity="information" if message.ok else "error")
        if message.ok:
            self.dismiss(None)

    # actions ----------------------------------------------------------------------------
    def action_write(self) -> None:
        if self.report is None or self.inputs is None:
            self.query_one("#report-status", Label).update("still collecting: wait for it")
            return
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.directory / default_report_name(self.report.job, stamp)
        self.written = path
        self._write(self.report, path)

    def action_toggle_anonymize(self) -> None:
        self.anonymize = not self.anonymize
        self.query_one("#report-title", Label).update(self._title())
        if self.inputs is not None:
            self._build(self.inputs)
        self._say()

    def action_cancel(self) -> None:
        self.dismiss(None)


def followed_log(app: object, capture: StackCapture) -> ReportRequest | None:
    """The log the Health screen follows (`app.health_target`), for a report on `capture`
    when the capture is of that job: a process of it matches the target's job pattern (the
    demo's, `--areal`'s, the one `h` opened). The report then has the run's logs, config
    and metrics, as one made from the Health screen has."""
    target = getattr(app, "health_target", None)
    if not isinstance(target, HealthTarget) or not target.path or not target.match:
        return None
    try:
        pattern = re.compile(target.match)
    except re.error:
        return None
    if not any(pattern.search(r.cmdline) for r in capture.ranks):
        return None
    return ReportRequest(log_path=target.path, log_node=target.node)


def report_preview_for(
    app: object,
    analysis: StackAnalysis | None,
    diagnosis: Diagnosis | None,
    request: ReportRequest | None = None,
) -> ReportPreview:
    """The preview of a report on the capture shown (made into its JSON document in the
    worker, not on the UI thread) and the console's nodes."""
    request = request or ReportRequest()
    source: CaptureSource | None = None
    if analysis is not None and diagnosis is not None:
        capture = analysis.capture

        def source() -> tuple[dict[str, Any] | None, str, str | None]:
            doc = capture_json(capture, analysis, diagnosis)
            return (
                doc,
                f"stacks from capture {capture.capture_id} taken at {capture.captured_at}",
                None,
            )

    elif request.capture is None:
        request.capture_note = ""

        def source() -> tuple[dict[str, Any] | None, str, str | None]:
            return None, "", "no stack capture yet (press s to capture the job's ranks first)"

    return ReportPreview(getattr(app, "fleet", None), request, take_capture=source)
