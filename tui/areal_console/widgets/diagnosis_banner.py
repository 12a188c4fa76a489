"""The diagnosis on top of the Stacks screen: pattern, title, evidence, next steps."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import Static

from areal_console.core.stacks.diagnose import Diagnosis

# "/long/path/to/file.py:12" -> "file.py:12": the full paths are in the report and JSON.
_PATH_DIRS = re.compile(r"(?<=[( ])/[^ ()]*/(?=[^/ ()]+:\d+)")

PATTERN_STYLE = {
    "cleanup_deadlock": "bold white on dark_red",
    "collective_mismatch": "bold white on dark_red",
    "missing_ranks": "bold white on dark_red",
    "same_collective": "bold black on dark_orange",
    "progressing": "bold black on green",
    "none": "bold white on grey37",
}


def banner_text(diagnosis: Diagnosis, max_evidence: int = 4, max_suggestions: int = 3) -> Text:
    text = Text()
    text.append(f" {diagnosis.pattern} ", style=PATTERN_STYLE.get(diagnosis.pattern, "reverse"))
    text.append(f" {diagnosis.title}\n", style="bold")
    text.append(diagnosis.detail + "\n")
    for line in diagnosis.evidence[:max_evidence]:
        text.append("  • ", style="dim")
        text.append(_PATH_DIRS.sub("", line) + "\n")
    if len(diagnosis.evidence) > max_evidence:
        text.append(f"  … {len(diagnosis.evidence) - max_evidence} more\n", style="dim")
    for line in diagnosis.suggestions[:max_suggestions]:
        text.append("  → ", style="bold green")
        text.append(line + "\n", style="green")
    text.rstrip()
    return text


class DiagnosisBanner(Static):
    """Shows one `Diagnosis`; `show()` replaces it. One screen line per item."""

    DEFAULT_CSS = """
    DiagnosisBanner { text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, diagnosis: Diagnosis) -> None:
        self.diagnosis = diagnosis
        self.update(banner_text(diagnosis))
