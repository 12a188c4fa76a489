"""The Health screen's top line: running, stalled (with the key to capture stacks) or
finished, and the guide's warnings as episodes, newest first: active ones with their
remedies, ended ones with the steps they spanned."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

from areal_console.core.metrics.report import HealthReport
from areal_console.widgets.remote_text import remote_text

SHORT = 32  # terminal rows under which each warning and its remedy share one line


def banner_text(
    report: HealthReport | None,
    error: str | None = None,
    max_warnings: int = 6,
    compact: bool = False,
    folded: bool = False,
) -> RenderableType:
    """The verdict, then each warning (episode) with its remedy; `compact` (a short
    terminal): one line a warning, remedy after it, cut at the edge, so the metric rows
    keep the room; `folded`: only the newest warning, with how many more (`w` lists them)."""
    text = Text()
    if error:
        text.append(" no data ", style="bold white on dark_red")
        text.append_text(remote_text(f" {error}"))
        return text
    if report is None:
        text.append(" … ", style="reverse")
        text.append(" reading the run's log")
        return text
    stall = report.stall
    if stall.stalled:
        text.append(" STALLED ", style="bold white on dark_red")
        text.append_text(remote_text(f" {stall.describe()}. ", style="bold"))
        if stall.old:  # past AReaL's group timeout: a hung collective has ended the job
            text.append("Check that the job still runs (s captures its stacks).",
                        style="bold yellow")  # fmt: skip
        else:
            text.append("Press s to capture this job's stacks.", style="bold yellow")
    elif stall.finished:
        text.append(" finished ", style="bold black on green")
        text.append_text(remote_text(f" {stall.describe()}"))
    else:
        text.append(" running ", style="bold black on green")
        text.append_text(remote_text(f" {stall.describe()}"))
    checks = [w for w in report.warnings if w.check != "stalled"]  # newest first
    folded = folded and len(checks) > 1
    if (compact or folded) and checks:
        lines = Text(no_wrap=True, overflow="ellipsis")
        for w in checks[: 1 if folded else max_warnings]:
            lines.append("\n" if lines else "")
            # The finding first: on a narrow terminal the line is cut at its end.
            if w.active:
                lines.append("  ⚠ ", style="bold yellow")
            else:  # said first: a check mark alone beside warning text reads as "fine"
                lines.append(f"  ✓ ended, steps {w.first_step}-{w.last_step}: ", style="dim bold")
            if folded:
                lines.append(f"+{len(checks) - 1} more (w) ", style="bold")
            if w.active:
                lines.append_text(remote_text(w.summary, style="yellow"))
                lines.append(f" (since step {w.first_step})", style="yellow")
                lines.append(" → ", style="bold green")
                lines.append_text(remote_text(w.remedy, style="green"))
            else:
                lines.append_text(remote_text(w.summary, style="dim"))
        if len(checks) > max_warnings:
            lines.append(f"\n  … {len(checks) - max_warnings} more", style="dim")
        _stragglers(lines, report)
        _notes(lines, report.notes)
        return Group(text, lines)
    if not checks:
        text.append("\n  no warnings from the guide's checks", style="dim")
    for w in checks[:max_warnings]:
        if w.active:
            text.append(f"\n  ⚠ since step {w.first_step}: ", style="bold yellow")
            text.append_text(remote_text(w.summary, style="yellow"))
            text.append("\n    → ", style="bold green")
            text.append_text(remote_text(w.remedy, style="green"))
        else:
            text.append(f"\n  ✓ steps {w.first_step}-{w.last_step}, ended: ", style="dim bold")
            text.append_text(remote_text(w.summary, style="dim"))
    if len(checks) > max_warnings:
        text.append(f"\n  … {len(checks) - max_warnings} more", style="dim")
    _stragglers(text, report)
    _notes(text, report.notes)
    return text


def _stragglers(text: Text, report: HealthReport, most: int = 3) -> None:
    """The ranks slower than the others since some step (perf tracer files)."""
    for s in report.stragglers[:most]:
        text.append("\n" if text else "")
        text.append("  ⏱ straggler: ", style="bold magenta")
        text.append_text(remote_text(s.describe(), style="magenta"))
    if len(report.stragglers) > most:
        text.append(f"\n  … {len(report.stragglers) - most} more stragglers", style="dim")


def _notes(text: Text, notes: tuple[str, ...]) -> None:
    """What could not be read (records skipped, files dropped), two lines at most."""
    for note in notes[:2]:
        text.append("\n  ! ", style="bold red")
        text.append_text(remote_text(note, style="red"))
    if len(notes) > 2:
        text.append(f"\n  … {len(notes) - 2} more problems reading", style="dim")


class HealthBanner(Static):
    DEFAULT_CSS = """
    HealthBanner { height: auto; max-height: 12; padding: 0 1; background: $boost; }
    """

    _shown: tuple[HealthReport | None, str | None] = (None, None)
    # Whether every warning is listed: None follows the terminal (folded to one counted
    # line on a short one, so the metric rows keep the room); `w` sets it.
    expanded: bool | None = None

    @property
    def is_expanded(self) -> bool:
        short = self.app.size.height < SHORT
        return self.expanded if self.expanded is not None else not short

    def toggle(self) -> None:
        self.expanded = not self.is_expanded
        self.redraw()

    def show(self, report: HealthReport | None, error: str | None = None) -> None:
        self._shown = (report, error)
        self.update(banner_text(report, error, compact=self.app.size.height < SHORT,
                                folded=not self.is_expanded))  # fmt: skip

    def redraw(self) -> None:
        """Draw again for the terminal's height now (a resize)."""
        self.show(*self._shown)
