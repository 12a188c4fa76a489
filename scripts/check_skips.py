"""Compare the skips a pytest run printed (`-rs`) with the expected ones.

    python scripts/check_skips.py PYTEST_OUTPUT [tests/expected_skips.txt]

Each `SKIPPED [N] path[:line]: reason` line of the short test summary counts N skips for
(path, reason); line numbers are left out, so editing a test file does not change the
list. tests/expected_skips.txt holds one `N path: reason` line per expected (path, reason)
(`#` comments and blank lines ignored); docs/design/test-suite.md shows the same list. Exits 1,
printing the difference, when the run skipped anything else, or other counts; 0 otherwise.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (\S+?)(?::\d+)?: (.*)$")
EXPECTED = re.compile(r"^(\d+) (\S+): (.*)$")
DEFAULT_EXPECTED = Path(__file__).resolve().parent.parent / "tests" / "expected_skips.txt"


def printed_skips(output: str) -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for line in output.splitlines():
        m = SKIPPED.match(ANSI.sub("", line).rstrip())
        if m:
            found[(m[2], m[3])] += int(m[1])
    return found


def expected_skips(text: str) -> Counter[tuple[str, str]]:
    expected: Counter[tuple[str, str]] = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = EXPECTED.match(line)
        if not m:
            raise ValueError(f"line {number}: not `N path: reason`: {line!r}")
        expected[(m[2], m[3])] += int(m[1])
    return expected


def format_skips(skips: Counter[tuple[str, str]]) -> list[str]:
    return [f"{n} {path}: {reason}" for (path, reason), n in sorted(skips.items())]


def compare(output: str, expected_text: str) -> list[str]:
    """Lines describing each difference; empty when the run skipped exactly what is expected."""
    found, expected = printed_skips(output), expected_skips(expected_text)
    problems = []
    for key in sorted(found.keys() | expected.keys()):
        if found[key] != expected[key]:
            path, reason = key
            problems.append(f"expected {expected[key]}, skipped {found[key]}: {path}: {reason}")
    return problems


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: check_skips.py PYTEST_OUTPUT [EXPECTED_SKIPS]", file=sys.stderr)
        return 2
    output = Path(argv[0]).read_text(errors="replace")
    expected_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_EXPECTED
    try:
        problems = compare(output, expected_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problems:
        print(f"error: the skips differ from {expected_path.name}:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        print("this run's skips, in that file's format:", file=sys.stderr)
        for line in format_skips(printed_skips(output)):
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"skips as expected ({sum(printed_skips(output).values())}, {expected_path.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
