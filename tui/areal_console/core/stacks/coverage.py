"""What a capture covered: ranks captured of those expected, and the nodes that failed.

Stated with every capture, in text, JSON and on screen:
`4,080 of 4,096 ranks; 2 nodes failed: n017 (timeout 5 s), n233 (authentication)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from areal_console.core.stacks.merge import expected_world_size
from areal_console.core.stacks.records import StackCapture

# Failed nodes named in one line; the rest are counted ("and 12 more").
NAMED_NODES = 8


@dataclass(frozen=True)
class NodeFailed:
    """A node the capture has nothing from, and why in a word or two."""

    node: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason}


@dataclass(frozen=True)
class Coverage:
    ranks_captured: int  # ranks with a stack
    ranks_expected: int  # the job's world size where the ranks say it, else the ranks seen
    nodes_failed: tuple[NodeFailed, ...]

    @property
    def complete(self) -> bool:
        return self.ranks_captured >= self.ranks_expected and not self.nodes_failed

    def line(self) -> str:
        """`4,080 of 4,096 ranks; 2 nodes failed: n017 (timeout 5 s), n233 (authentication)`."""
        text = f"{self.ranks_captured:,} of {self.ranks_expected:,} ranks"
        failed = self.nodes_failed
        if not failed:
            return text
        named = ", ".join(f"{f.node} ({f.reason})" for f in failed[:NAMED_NODES])
        more = f" and {len(failed) - NAMED_NODES:,} more" if len(failed) > NAMED_NODES else ""
        word = "node" if len(failed) == 1 else "nodes"
        return f"{text}; {len(failed):,} {word} failed: {named}{more}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks_captured": self.ranks_captured,
            "ranks_expected": self.ranks_expected,
            "nodes_failed": [f.to_json() for f in self.nodes_failed],
        }


_TIMEOUT = re.compile(r"^timeout (\d+(?:\.\d+)?) s\b")
_NO_ANSWER = re.compile(
    r"no SSH answer within (\d+(?:\.\d+)?)s|timed out after (\d+(?:\.\d+)?)s"
    r"|did not start within (\d+(?:\.\d+)?) ?s"
)
# (words in the error, reason): the first that matches names the failure
_REASONS = (
    ("authentication failed", "authentication"),
    ("permission denied (publickey", "authentication"),  # OpenSSH, on a relay's hop
    ("host key", "host key"),
    ("connection refused", "refused"),
    ("cannot resolve host name", "unknown host"),
    ("cannot reach", "unreachable"),
    ("not found on", "no python"),
    ("connection lost", "connection lost"),
    ("was killed", "agent killed"),
)


def short_reason(error: str) -> str:
    """A node's error in a word or two for the coverage line (`timeout 5 s`,
    `authentication`, ...); the full error stays in the capture's `errors`."""
    match = _TIMEOUT.match(error) or _NO_ANSWER.search(error)
    if match:
        seconds = next(g for g in match.groups() if g)
        return f"timeout {seconds} s"
    lowered = error.lower()
    for words, reason in _REASONS:
        if words in lowered:
            return reason
    first = error.split(":", 1)[0].strip() if ": " in error else error.strip()
    return first[:40] or "failed"


def capture_coverage(capture: StackCapture) -> Coverage:
    """The coverage of `capture` (a pure function of it)."""
    ranks = capture.rank_stacks
    captured = sum(1 for r in ranks if r.state == "ok")
    expected = max(expected_world_size(capture.ranks) or 0, len({r.rank for r in ranks}))
    failed: dict[str, str] = {}
    for error in capture.errors:
        failed.setdefault(error.node, short_reason(error.error))
    names = sorted(failed, key=_natural)
    return Coverage(captured, expected, tuple(NodeFailed(n, failed[n]) for n in names))


def _natural(name: str) -> list[Any]:
    """`node2` before `node10`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
