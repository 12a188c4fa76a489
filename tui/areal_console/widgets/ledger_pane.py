"""The collective ledger beside the rank groups: per process group, which collective each
rank is in, and what is wrong (a mismatch by sequence id, ranks behind, ranks absent);
then who waits for whom across groups (a deadlock cycle, or the rank the waits end at)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from areal_console.core.ledger.analyse import GroupLedger, Ledger
from areal_console.core.ledger.collect import absent_note
from areal_console.core.ledger.waitfor import WaitForGraph
from areal_console.core.stacks.nccl_ras import RasStatus
from areal_console.widgets.remote_text import remote_text


def ledger_text(
    ledger: Ledger | None, graph: WaitForGraph | None = None, ras: RasStatus | None = None
) -> Text:
    """The wait-for conclusions first (a deadlock, a root), one line per used process
    group with its findings under it; one line when there is no ledger. Then NCCL's RAS
    report, when a rank serves one."""
    text = Text()
    if ledger is None or not ledger.groups:
        text.append_text(remote_text(absent_note(ledger), style="dim"))
        if ledger is not None:  # asked, and no rank had a trace
            text.append("  F: how to turn it on", style="bold")
        text.append("\n")
    else:
        if graph is not None:
            for c in graph.cycles:
                text.append("deadlock ", style="bold red")
                text.append_text(remote_text(c.describe(), style="red"))
                text.append("\n")
            for r in graph.roots:
                text.append("root ", style="bold yellow")
                text.append_text(remote_text(r.describe(), style="yellow"))
                text.append("\n")
        shown, folded = listed_groups(ledger.used_groups)
        for g in shown:
            text.append_text(remote_text(g.label, style="bold"))
            text.append_text(remote_text(f"  {g.summary()}"))
            text.append("\n")
            for problem in g.problems():
                text.append("  ! ", style="bold red")
                text.append_text(remote_text(problem, style="red"))
                text.append("\n")
        if folded:
            first, last = folded[0].label, folded[-1].label
            what = f"+{len(folded)} groups without findings ({first} … {last})"
            text.append_text(remote_text(what, style="dim"))
            text.append("\n")
        for note in ledger.notes:
            text.append_text(remote_text(note, style="dim"))
            text.append("\n")
    for error in ledger.errors if ledger is not None else ():
        text.append("  ! ", style="bold red")
        text.append_text(remote_text(error, style="red"))
        text.append("\n")
    if ras is not None:
        text.append("NCCL RAS ", style="bold")
        text.append_text(remote_text(ras.address or "", style="dim"))
        text.append("\n")
        lagging = set(ras.lagging_ranks())
        for line in ras.lines():
            style = "yellow" if lagging and "up to #" in line else ""
            text.append_text(remote_text(line, style=style))
            text.append("\n")
    text.rstrip()
    return text


# Groups listed one a line when a job has many (a 4,096-rank job with tensor and data
# parallelism has over 500): past this many, the groups with findings come first and the
# rest are counted in one line, so that the pane's ten lines show what is wrong.
LISTED = 4


def listed_groups(groups: list[GroupLedger]) -> tuple[list[GroupLedger], list[GroupLedger]]:
    """(groups shown one a line, groups counted in one line). Up to LISTED + 1 groups all
    are shown in their order; more: every group with a finding, then healthy ones up to
    LISTED groups in all."""
    if len(groups) <= LISTED + 1:
        return groups, []
    shown = [g for g in groups if not g.healthy]
    healthy = [g for g in groups if g.healthy]
    room = max(0, LISTED - len(shown))
    return shown + healthy[:room], healthy[room:]


class LedgerPane(Static):
    """Shows one capture's `Ledger` and its wait-for graph (or says once there is none)."""

    DEFAULT_CSS = """
    LedgerPane { height: auto; max-height: 10; padding: 0 1; }
    """

    def show(
        self, ledger: Ledger | None, graph: WaitForGraph | None = None, ras: RasStatus | None = None
    ) -> None:
        self.ledger = ledger
        self.update(ledger_text(ledger, graph, ras))
