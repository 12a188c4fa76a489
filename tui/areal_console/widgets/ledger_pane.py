"""The collective ledger beside the rank groups: per process group, which collective each
rank is in, and what is wrong (a mismatch by sequence id, ranks behind, ranks absent)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from areal_console.core.ledger.analyse import Ledger
from areal_console.core.ledger.collect import absent_note
from areal_console.widgets.remote_text import remote_text


def ledger_text(ledger: Ledger | None) -> Text:
    """One line per used process group, its findings under it; one line when there is none."""
    text = Text()
    if ledger is None or not ledger.groups:
        text.append_text(remote_text(absent_note(ledger), style="dim"))
        text.append("\n")
    else:
        for g in ledger.used_groups:
            text.append_text(remote_text(g.label, style="bold"))
            text.append_text(remote_text(f"  {g.summary()}"))
            text.append("\n")
            for problem in g.problems():
                text.append("  ! ", style="bold red")
                text.append_text(remote_text(problem, style="red"))
                text.append("\n")
        for note in ledger.notes:
            text.append_text(remote_text(note, style="dim"))
            text.append("\n")
    for error in ledger.errors if ledger is not None else ():
        text.append("  ! ", style="bold red")
        text.append_text(remote_text(error, style="red"))
        text.append("\n")
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
