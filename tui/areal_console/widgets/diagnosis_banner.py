"""The diagnosis on top of the Stacks screen: pattern, title, evidence, next steps."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import Static

from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.widgets.remote_text import remote_block

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
    # Evidence quotes what ranks, servers and files said (frame names, a `--config` path,
    # a server's error): through the one escaping path, as every remote text.
    text.append_text(remote_block(f" {diagnosis.title}\n", style="bold"))
    text.append_text(remote_block(diagnosis.detail + "\n"))
    for line in diagnosis.evidence[:max_evidence]:
        text.append("  • ", style="dim")
        text.append_text(remote_block(_PATH_DIRS.sub("", line) + "\n"))
    if len(diagnosis.evidence) > max_evidence:
        text.append(f"  … {len(diagnosis.evidence) - max_evidence} more\n", style="dim")
    for line in diagnosis.suggestions[:max_suggestions]:
        text.append("  → ", style="bold green")
        text.append_text(remote_block(line + "\n", style="green"))
    text.rstrip()
    return text


class DiagnosisBanner(Static):
    """Shows one `Diagnosis`; `show()` replaces it. One screen line per item, cut at the
    edge; `toggle_full()` wraps every line and shows all evidence and suggestions."""

    DEFAULT_CSS = """
    DiagnosisBanner { text-wrap: nowrap; text-overflow: ellipsis; }
    DiagnosisBanner.-full { text-wrap: wrap; overflow-y: auto; }
    """

    full = False

    def show(self, diagnosis: Diagnosis) -> None:
        self.diagnosis = diagnosis
        self._draw()

    def toggle_full(self) -> bool:
        self.full = not self.full
        self.set_class(self.full, "-full")
        self._draw()
        return self.full

    def _draw(self) -> None:
        diagnosis = getattr(self, "diagnosis", None)
        if diagnosis is None:
            return
        if self.full:
            self.update(banner_text(diagnosis, max_evidence=1000, max_suggestions=1000))
        else:
            self.update(banner_text(diagnosis))
