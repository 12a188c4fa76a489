"""The checklist's root-cause note reads the ledger's wait-for graph as sentences (a
saved capture of a real cross-group deadlock: tests/data/pyspy/saved_wrong_group.json)."""

from __future__ import annotations

import json
from pathlib import Path

from areal_console.core.report.sections import root_cause

DATA = Path(__file__).resolve().parents[1] / "data" / "pyspy"


def test_wait_for_cycle_and_edges_in_words() -> None:
    capture = json.loads((DATA / "saved_wrong_group.json").read_text())
    lines = root_cause(capture)
    assert lines[0].startswith("Diagnosis: **Cross-group deadlock: ranks 2-3 wait on each other")
    assert ("- Wait-for cycle (a deadlock across groups): rank 2 (in all_reduce of group 0) "
            "waits for rank 3 (in all_reduce of group 3) waits for rank 2") in lines  # fmt: skip
    assert "- Wait-for edges: 4 (in the bundle's ledger.json)" in lines
    assert not any("edges=" in line or "{" in line for line in lines)


def test_no_wait_for_graph_says_nothing_of_it() -> None:
    capture = {"diagnosis": {"pattern": "none", "title": "No hang pattern recognised"},
               "groups": [], "ranks": [],
               "ledger": {"groups": [], "wait_for": {"edges": [], "edges_left_off": 0,
                                                     "cycles": [], "roots": []}}}  # fmt: skip
    assert root_cause(capture) == ["Diagnosis: **No hang pattern recognised** (`none`)."]
