"""The collective ledger beside the rank groups: per process group, which collective each
rank is in, and what is wrong (a mismatch by sequence id, ranks behind, ranks absent)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from areal_console.core.ledger.analyse import Ledger
from areal_console.core.ledger.collect import absent_note


def ledger_text(ledger: Ledger | None) -> Text:
    """One line per used process group, its findings under it; one line when there is none."""
    text = Text()
    if ledger is None or not ledger.groups:
        text.append(absent_note(ledger), style="dim")
        return text
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
    """Shows one capture's `Ledger` (or says once that there is none)."""

    DEFAULT_CSS = """
    LedgerPane { height: auto; max-height: 10; padding: 0 1; }
    """

    def show(self, ledger: Ledger | None) -> None:
        self.ledger = ledger
        self.update(ledger_text(ledger))
