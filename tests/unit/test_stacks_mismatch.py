"""The collective-mismatch headline names the odd ranks and both call sites, and stack
groups are lettered so they are never read as ranks.

Data: tests/data/pyspy/collective_mismatch.json, a real py-spy capture of the hang
scenario (4 gloo ranks: 0 and 2 in all_reduce at hang.py:142, 1 and 3 in broadcast at
hang.py:145); the 3-vs-1 case moves rank 2's stacks onto rank 1's.
"""

from __future__ import annotations

import json
from pathlib import Path

from areal_console.core.stacks import StackCapture, analyse, diagnose
from areal_console.core.stacks.merge import group_name
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.report import text_report

RECORDED = Path(__file__).resolve().parents[1] / "data" / "pyspy" / "collective_mismatch.json"


def recorded() -> StackCapture:
    return build_capture(json.loads(RECORDED.read_text()))


def test_two_against_two_names_both_sides_and_both_call_sites() -> None:
    d = diagnose(analyse(recorded()))
    assert d.pattern == "collective_mismatch"
    assert d.detail.startswith(
        "Ranks 0,2 call all_reduce at hang.py:142 while ranks 1,3 call broadcast at hang.py:145; "
    ), d.detail


def test_one_odd_rank_is_named_first() -> None:
    capture = recorded()
    one, two = capture.find_rank(1), capture.find_rank(2)
    assert one is not None and two is not None
    two.threads = one.threads  # rank 2 now broadcasts like ranks 1 and 3
    d = diagnose(analyse(capture))
    assert d.detail.startswith(
        "Rank 0 calls all_reduce at hang.py:142 while ranks 1-3 call broadcast at hang.py:145"
    ), d.detail
    assert "All 4 ranks" not in d.detail


def test_groups_are_lettered_in_the_report() -> None:
    report = text_report(recorded())
    assert "Group A: ranks 0,2 (2)" in report and "Group B: ranks 1,3 (2)" in report
    assert "Group 1" not in report


def test_group_names_go_on_past_z() -> None:
    assert [group_name(i) for i in (0, 1, 25, 26, 27, 701, 702)] == [
        "A", "B", "Z", "AA", "AB", "ZZ", "AAA",
    ]  # fmt: skip
