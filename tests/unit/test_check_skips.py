"""scripts/check_skips.py (what `.ci/run` uses to fail a run that skipped what CI provides),
and tests/expected_skips.txt against docs/design/test-suite.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import check_skips  # noqa: E402

OUTPUT = """\
=========================== short test summary info ============================
SKIPPED [2] tests/test_a.py:40: $AREAL_REPO is not set (an AReaL git checkout with cbff54d)
\x1b[33mSKIPPED\x1b[0m [1] tests/conftest.py:191: $AREAL_REPO is not set (an AReaL git checkout with cbff54d)
SKIPPED [1] tests/test_b.py: tmux is not installed
SKIPPED [3] tests/test_a.py:77: $AREAL_REPO is not set (an AReaL git checkout with cbff54d)
=========== 10 passed, 7 skipped in 1.00s ===========
"""
EXPECTED = """\
# comment
5 tests/test_a.py: $AREAL_REPO is not set (an AReaL git checkout with cbff54d)
1 tests/conftest.py: $AREAL_REPO is not set (an AReaL git checkout with cbff54d)

1 tests/test_b.py: tmux is not installed
"""


def test_printed_skips_are_summed_by_path_and_reason_without_line_numbers() -> None:
    assert check_skips.compare(OUTPUT, EXPECTED) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("5 tests/test_a.py", "4 tests/test_a.py"), "expected 4, skipped 5: tests/test_a.py"),
        (("1 tests/test_b.py: tmux is not installed\n", ""), "expected 0, skipped 1: tests/test_b.py"),
        (("# comment", "1 tests/test_c.py: no Slurm"), "expected 1, skipped 0: tests/test_c.py: no Slurm"),
    ],
)  # fmt: skip
def test_any_difference_is_reported(change: tuple[str, str], problem: str) -> None:
    problems = check_skips.compare(OUTPUT, EXPECTED.replace(*change))
    assert len(problems) == 1 and problems[0].startswith(problem)


def test_the_script_fails_a_run_with_an_unexpected_skip(tmp_path: Path) -> None:
    (tmp_path / "out.txt").write_text(OUTPUT)
    (tmp_path / "ok.txt").write_text(EXPECTED)
    (tmp_path / "short.txt").write_text(EXPECTED.replace("1 tests/test_b.py", "2 tests/test_b.py"))
    script = ROOT / "scripts" / "check_skips.py"

    def run(expected: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), str(tmp_path / "out.txt"), str(tmp_path / expected)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    assert run("ok.txt").returncode == 0
    bad = run("short.txt")
    assert bad.returncode == 1
    assert "expected 2, skipped 1: tests/test_b.py: tmux is not installed" in bad.stderr


def test_expected_skips_parse_and_the_docs_show_the_same_list() -> None:
    text = (ROOT / "tests" / "expected_skips.txt").read_text()
    expected = check_skips.expected_skips(text)
    docs = (ROOT / "docs" / "design" / "test-suite.md").read_text()
    block = re.search(r"<!-- expected-skips -->\n```\n(.*?)```", docs, re.S)
    assert block, "docs/design/test-suite.md has no expected-skips block"
    assert check_skips.expected_skips(block.group(1)) == expected
