"""What the ledger adds to a stack diagnosis: the collective's sequence id and group, and
who waits for whom across groups (a deadlock between groups, or the rank every wait
ends at)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from areal_console.core.common.rankset import format_ranks
from areal_console.core.ledger.analyse import Ledger
from areal_console.core.ledger.waitfor import (
    RankActivity,
    WaitForGraph,
    build_wait_for,
    waiting_on_cycles,
)
from areal_console.core.stacks.diagnose import DEBUG_ENV, Diagnosis, collective_frame, describe
from areal_console.core.stacks.merge import StackAnalysis

EVIDENCE_PREFIX = "Flight Recorder: "
WAIT_PREFIX = "wait-for: "
# Patterns that say "the collective itself does not complete" or "nothing recognised":
# the wait-for graph can replace their conclusion. The others (a dead rank, cleanup,
# rollout, progress) say more than the graph; it only adds evidence to them.
REPLACEABLE = ("same_collective", "collective_mismatch", "none")
ROOT_KINDS = {
    "dead": "dead",
    "compute": "outside any collective",
    "collective": "in a collective",
    "unknown": "stack not captured",
}


def stack_activity(analysis: StackAnalysis) -> dict[int, RankActivity]:
    """What each rank's stack shows, for the ranks at the end of the waits."""
    out: dict[int, RankActivity] = {}
    for r in analysis.capture.rank_stacks:
        if r.rank is None or r.rank in out:
            continue
        if r.state != "ok":
            state = "gone" if r.state == "gone" else "error"
            out[r.rank] = RankActivity(r.rank, state, r.error or r.state)
            continue
        frames = r.work_frames
        state = "collective" if collective_frame(frames) is not None else "compute"
        out[r.rank] = RankActivity(r.rank, state, describe(frames))
    for rank in analysis.missing:
        out.setdefault(rank, RankActivity(rank, "gone"))
    return out


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = sorted(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def with_ledger(
    diagnosis: Diagnosis, ledger: Ledger | None, activity: Mapping[int, RankActivity] | None = None
) -> Diagnosis:
    """`diagnosis` with the ledger's findings as evidence, led by the wait-for graph: a
    deadlock between groups, or the rank every wait ends at; else the title names the
    first mismatched collective by sequence id when the ranks disagree."""
    if ledger is None or not ledger.groups:
        return diagnosis
    graph = build_wait_for(ledger, activity or {})
    findings = ledger.findings()
    evidence = [EVIDENCE_PREFIX + f for f in findings]
    evidence += [WAIT_PREFIX + line for line in graph.lines()[:12]]
    evidence += list(diagnosis.evidence)
    if not findings:
        evidence.insert(0, EVIDENCE_PREFIX + "every group's ranks agree on their collectives")
    diagnosis = replace(diagnosis, evidence=evidence, wait_for=graph)
    if graph.cycles and diagnosis.pattern in REPLACEABLE:
        return _deadlock(diagnosis, graph)
    if graph.roots and not graph.cycles and diagnosis.pattern in ("same_collective", "none"):
        return _rooted(diagnosis, graph)
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
            return replace(diagnosis, title=title)
        return _named_roots(diagnosis, graph)
    first = mismatched[0]
    assert first.mismatch is not None
    if diagnosis.pattern == "weight_update_stuck":
        # The weight-update group's two sides sent different sizes or dtypes (AReaL #1439).
        title = (
            f"Weight update stuck: {first.mismatch.kind} mismatch at collective "
            f"#{first.mismatch.seq} of {first.label}"
        )
        detail = f"{first.mismatch.describe()}. {diagnosis.detail}".strip()
        return _named_roots(replace(diagnosis, title=title, detail=detail), graph)
    if diagnosis.pattern not in REPLACEABLE:
        return _named_roots(diagnosis, graph)  # a dead rank or cleanup says more
    title = f"Ranks disagree at collective #{first.mismatch.seq} of {first.label}"
    detail = f"{first.mismatch.describe()}. {diagnosis.detail}".strip()
    return replace(diagnosis, pattern="collective_mismatch", title=title, detail=detail)


def _named_roots(diagnosis: Diagnosis, graph: WaitForGraph) -> Diagnosis:
    """An existing pattern, its detail naming the rank(s) every wait ends at."""
    if not graph.roots or graph.cycles:
        return diagnosis
    roots = ", ".join(r.describe() for r in graph.roots[:4])
    return replace(diagnosis, detail=f"{diagnosis.detail} Every wait ends at {roots}.".strip())


def _deadlock(diagnosis: Diagnosis, graph: WaitForGraph) -> Diagnosis:
    first = graph.cycles[0]
    groups = sorted(set(first.groups), key=lambda g: (not g.isdigit(), g.zfill(8)))
    on_cycle = sorted(graph.in_cycles)
    outside = waiting_on_cycles(graph)
    detail = (
        f"{first.describe()[0].upper()}{first.describe()[1:]}. No collective on the cycle "
        "can complete: each waits for a rank blocked in another group. Usually a rank "
        "passed a different process group than its peers (a tensor- or data-parallel "
        "group instead of the default one), or ranks issue collectives on different "
        "groups in a different order."
    )
    if outside:
        verb = "waits" if len(outside) == 1 else "wait"
        detail += f" {_ranks(outside).capitalize()} {verb} on the cycle."
    if len(graph.cycles) > 1:
        detail += f" {len(graph.cycles)} cycles in all (evidence lists them)."
    return replace(
        diagnosis,
        pattern="cross_group_deadlock",
        title=(
            f"Cross-group deadlock: {_ranks(on_cycle)} wait on each other across "
            f"{'groups' if len(groups) > 1 else 'group'} {', '.join(groups)}"
        ),
        detail=detail,
        evidence=[WAIT_PREFIX + "deadlock: " + c.describe() for c in graph.cycles]
        + [e for e in diagnosis.evidence if not e.startswith(WAIT_PREFIX + "deadlock: ")],
        suggestions=[
            "At each call site on the cycle, check which process group is passed (`group=`): "
            "every member must call the same collectives on the same group in the same order",
            "Look for rank-dependent choices of the group (tensor- vs data-parallel, a "
            "`group=None` default) and for collectives issued on two groups in a "
            "different order on different ranks",
            DEBUG_ENV,
        ],
    )


def _rooted(diagnosis: Diagnosis, graph: WaitForGraph) -> Diagnosis:
    """No cycle: the waits end at the roots; name them instead of the network."""
    roots = graph.roots
    waiting = sorted({r for root in roots for r in root.waited_by})
    names = _ranks([r.rank for r in roots])
    first = roots[0]
    kinds = {r.kind for r in roots}
    if kinds == {"collective"}:
        return _named_roots(diagnosis, graph)  # they wait in a call every member reached
    title = (
        f"{_ranks(waiting).capitalize()} wait, directly or through each other, on {names}"
        f" ({'; '.join(dict.fromkeys(ROOT_KINDS[r.kind] for r in roots))})"
    )
    detail = (
        f"The ledger shows every blocked rank waiting for another: the waits end at "
        f"{', '.join(r.describe() for r in roots[:4])}. The collectives are fine; "
        f"{names} {'is' if len(roots) == 1 else 'are'} why they never complete."
    )
    suggestions = [
        f"Look at what {names} is doing: {first.why}",
        "Capture again with --samples 3 to see whether it moves (slow) or not (stuck)",
    ]
    if "dead" in kinds:
        suggestions.insert(
            0,
            "Read the dead rank's log and exit status; check `dmesg` for the OOM killer",
        )
    return replace(diagnosis, title=title, detail=detail, suggestions=[*suggestions, DEBUG_ENV])
