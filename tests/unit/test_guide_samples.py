"""docs/guide/guide.md's sample outputs are the code's: regenerated from a real demo run by
scripts/guide_samples.py, and checked here so they cannot drift."""

from __future__ import annotations

import difflib

import pytest

from scripts.guide_samples import BLOCK, GUIDE, generate, normalise, with_samples


def test_the_guide_marks_each_generated_sample() -> None:
    names = [m["name"] for m in BLOCK.finditer(GUIDE.read_text())]
    assert names == ["collective-stacks", "collective-replay"]


def test_what_varies_between_runs_is_replaced() -> None:
    text = ("Stack capture 20270101-101010-abcd at 2027-01-01T10:10:10+00:00 job localhost:41234\n"
            "  all_reduce (/root/.pyenv/lib/python3.11/site-packages/torch/x/distributed_c10d.py:3252)\n"
            "job replay-20270101-101010-0a1b2c on h: log /tmp/areal-console-demo-x1y2/dump\n")  # fmt: skip
    assert normalise(text) == (
        "Stack capture 20261122-060137-55f5 at 2026-11-22T06:01:37+00:00 job localhost:29500\n"
        "  all_reduce (…/distributed_c10d.py:3252)\n"
        "job replay-20261122-060159-b66a45 on h: log …/dump\n"
    )


@pytest.mark.slow
def test_the_guide_samples_are_what_the_code_prints_now() -> None:
    guide = GUIDE.read_text()
    updated = with_samples(guide, generate())
    diff = "".join(difflib.unified_diff(guide.splitlines(True), updated.splitlines(True),
                                        "docs/guide/guide.md", "generated"))  # fmt: skip
    assert updated == guide, f"run scripts/guide_samples.py to update the guide:\n{diff}"
