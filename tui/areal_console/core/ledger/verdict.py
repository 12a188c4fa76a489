"""What the ledger adds to a stack diagnosis: the collective's sequence id and group."""

from __future__ import annotations

from dataclasses import replace

from areal_console.core.ledger.analyse import Ledger
from areal_console.core.stacks.diagnose import Diagnosis

EVIDENCE_PREFIX = "Flight Recorder: "


def with_ledger(diagnosis: Diagnosis, ledger: Ledger | None) -> Diagnosis:
    """`diagnosis` with the ledger's findings as evidence, and the title naming the first
    mismatched collective by sequence id when the ranks disagree."""
    if ledger is None or not ledger.groups:
        return diagnosis
    findings = ledger.findings()
    evidence = [EVIDENCE_PREFIX + f for f in findings] + list(diagnosis.evidence)
    if not findings:
        evidence.insert(0, EVIDENCE_PREFIX + "every group's ranks agree on their collectives")
    mismatched = [g for g in ledger.groups if g.mismatch is not None]
    if not mismatched:
        lagging = [g for g in ledger.groups if g.behind]
        if lagging and diagnosis.pattern in ("same_collective", "none"):
            # Same line on every stack, but not the same call: a rank is behind.
            g = lagging[0]
            title = f"{g.problems()[0].capitalize()} in {g.label}"
            ahead = max(g.positions, key=lambda p: p.head)
            if ahead.call is not None:
                title += f"; the others wait in {ahead.call.describe()}"
            return replace(diagnosis, title=title, evidence=evidence)
        return replace(diagnosis, evidence=evidence)
    first = mismatched[0]
    assert first.mismatch is not None
    if diagnosis.pattern not in ("same_collective", "collective_mismatch", "none"):
        return replace(diagnosis, evidence=evidence)  # a dead rank or cleanup says more
    title = f"Ranks disagree at collective #{first.mismatch.seq} of {first.label}"
    pattern = "collective_mismatch"
    detail = f"{first.mismatch.describe()}. {diagnosis.detail}".strip()
    return replace(diagnosis, pattern=pattern, title=title, detail=detail, evidence=evidence)
