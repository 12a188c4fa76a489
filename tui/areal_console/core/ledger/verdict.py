"""What the ledger adds to a stack diagnosis: the collective's sequence id and group."""

from __future__ import annotations

from dataclasses import replace

from areal_console.core.ledger.analyse import GroupLedger, Ledger
from areal_console.core.rankset import format_ranks
from areal_console.core.stacks.diagnose import DEBUG_ENV, NCCL_TIMEOUT, Diagnosis

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
        crossed = cross_group_waits(lagging)
        if crossed and diagnosis.pattern in ("same_collective", "none"):
            return _groups_crossed(diagnosis, crossed, evidence)
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


def cross_group_waits(lagging: list[GroupLedger]) -> dict[int, GroupLedger]:
    """Rank -> the group it waits in, when ranks wait on different groups for each other:
    every rank behind in one group is itself waiting in another (a cycle no network fault
    explains). Empty when the ledger does not show that."""
    waits: dict[int, GroupLedger] = {}
    for g in lagging:
        for p in g.positions:
            if p.head and p.rank not in g.behind:
                waits.setdefault(p.rank, g)
    behind = {r for g in lagging for r in g.behind}
    if len({g.name for g in waits.values()}) < 2 or not behind <= set(waits):
        return {}
    return waits


def _groups_crossed(
    diagnosis: Diagnosis, waits: dict[int, GroupLedger], evidence: list[str]
) -> Diagnosis:
    by_group: dict[str, list[int]] = {}
    for rank, g in sorted(waits.items()):
        by_group.setdefault(g.label, []).append(rank)
    where = ", ".join(f"{_ranks(r)} in {label}" for label, r in by_group.items())
    return replace(
        diagnosis,
        pattern="collective_mismatch",
        title=f"Ranks wait on different process groups: {where}",
        detail=(
            f"Every rank is blocked in a collective, but not on the same group: {where}. "
            "Each waits for a peer that is waiting on another group, so none can complete. "
            "The program sent the ranks to different groups (a group chosen by rank, or a "
            "collective skipped on some ranks): not a network or NCCL problem."
        ),
        evidence=evidence,
        suggestions=[
            "Look at the `group=` each rank passes at the collective's call site: every "
            "member of a group must call the same collectives on it, in the same order",
            DEBUG_ENV,
            NCCL_TIMEOUT,
        ],
    )


def _ranks(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"
