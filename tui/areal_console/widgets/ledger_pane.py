"""The collective ledger beside the rank groups: per process group, which collective each
rank is in, and what is wrong (a mismatch by sequence id, ranks behind, ranks absent);
then who waits for whom across groups (a deadlock cycle, or the rank the waits end at)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from areal_console.core.ledger.analyse import Ledger
from areal_console.core.ledger.collect import absent_note
from areal_console.core.ledger.waitfor import WaitForGraph


def ledger_text(ledger: Ledger | None, graph: WaitForGraph | None = None) -> Text:
    """The wait-for conclusions first (a deadlock, a root), one line per used process
    group with its findings under it; one line when there is no ledger."""
    text = Text()
    if ledger is None or not ledger.groups:
        text.append(absent_note(ledger), style="dim")
        return text
    if graph is not None:
        for c in graph.cycles:
            text.append("deadlock ", style="bold red")
            text.append(c.describe() + "\n", style="red")
        for r in graph.roots:
            text.append("root ", style="bold yellow")
            text.append(f"{r.describe()}\n", style="yellow")
    for g in ledger.used_groups:
        text.append(g.label, style="bold")
        text.append(f"  {g.summary()}\n")
        for problem in g.problems():
            text.append("  ! ", style="bold red")
            text.append(problem + "\n", style="red")
    for note in ledger.notes:
        text.append(note + "\n", style="dim")
    text.rstrip()
    return text


class LedgerPane(Static):
    """Shows one capture's `Ledger` and its wait-for graph (or says once there is none)."""

    DEFAULT_CSS = """
    LedgerPane { height: auto; max-height: 10; padding: 0 1; }
    """

    def show(self, ledger: Ledger | None, graph: WaitForGraph | None = None) -> None:
        self.ledger = ledger
        self.update(ledger_text(ledger, graph))
