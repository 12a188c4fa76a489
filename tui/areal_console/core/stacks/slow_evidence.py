"""What the stacks cannot see, fed into their diagnosis: a role of the job whose Slurm job
ended while the others wait (AReaL issue 1583), and a rank whose GPU idles while the
others' are busy (from NVML samples).

Both come with the capture (`StackCapture.ended_roles`, `.idle_gpus`, as `nodes --json`
and `stacks --json` write them), so a saved capture reopened later gives the same
diagnosis. An ended role is the likely cause of a hang: where the stacks show no progress
the diagnosis becomes `role_ended` and names it, with where the other roles' ranks wait.
An idle GPU names the rank the others probably wait for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from areal_console.core.common.rankset import brief_ranks
from areal_console.core.stacks.diagnose import Diagnosis, short_where
from areal_console.core.stacks.merge import StackAnalysis

ROLE_ENDED = "role_ended"
ENDED_PREFIX = "Slurm: "
IDLE_PREFIX = "GPU idle: "
# Patterns of a job that moves: an ended role is evidence there, not the cause of a hang.
NOT_HUNG = frozenset({"progressing"})
# Patterns where every rank looks alike to the stacks: an idle GPU tells them apart.
ALIKE = frozenset({"same_collective", "none", "collective_mismatch"})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if number == number else None


@dataclass(frozen=True, slots=True)
class RoleEnded:
    """A role whose Slurm job ended while the job's other roles still run."""

    role: str
    job_id: str
    state: str
    exit_code: str | None  # "status:signal"

    @classmethod
    def from_json(cls, doc: Any) -> RoleEnded | None:
        if not isinstance(doc, Mapping):
            return None
        role, job_id, state = (
            _text(doc.get("role")),
            _text(doc.get("job_id")),
            _text(doc.get("state")),
        )
        if role is None or job_id is None or state is None:
            return None
        return cls(
            role[:64], job_id[:32], state[:32], (_text(doc.get("exit_code")) or "")[:16] or None
        )

    def ended(self) -> str:
        """`role rollout's Slurm job 123 ended CANCELLED (exit 0:15)`."""
        code = f" (exit {self.exit_code})" if self.exit_code else ""
        return f"role {self.role}'s Slurm job {self.job_id} ended {self.state}{code}"


@dataclass(frozen=True, slots=True)
class GpuIdle:
    """A rank whose GPU idled across the samples while the other ranks' were busy."""

    node: str
    rank: int
    pid: int | None
    util: float
    others_median: float
    samples: int

    @classmethod
    def from_json(cls, doc: Any) -> GpuIdle | None:
        if not isinstance(doc, Mapping):
            return None
        rank, util, median = (
            doc.get("rank"),
            _number(doc.get("util")),
            _number(doc.get("others_median")),
        )
        if type(rank) is not int or util is None or median is None:
            return None
        pid, samples = doc.get("pid"), doc.get("samples")
        return cls(
            (_text(doc.get("node")) or "?")[:128],
            rank,
            pid if type(pid) is int else None,
            util,
            median,
            samples if type(samples) is int else 0,
        )

    def describe(self) -> str:
        return (f"{self.node}: rank {self.rank}'s GPU is idle ({self.util:.0f}% mean over "
                f"{self.samples} samples) while the other ranks' median is "
                f"{self.others_median:.0f}%")  # fmt: skip


def ended_roles(docs: Sequence[Any]) -> list[RoleEnded]:
    return [r for d in docs if (r := RoleEnded.from_json(d)) is not None]


def idle_gpus(docs: Sequence[Any]) -> list[GpuIdle]:
    return [g for d in docs if (g := GpuIdle.from_json(d)) is not None]


def waiting_where(analysis: StackAnalysis, ended: Sequence[str]) -> tuple[str, str]:
    """(whose ranks wait, where): `the actor's ranks`, `rollout_wait > all_reduce` from the
    largest group of the ranks outside the `ended` roles ("" where none was captured)."""
    gone = set(ended)
    waiting = [
        r
        for r in analysis.capture.rank_stacks
        if r.state == "ok" and r.rank is not None and r.role not in gone
    ]
    roles = sorted({r.role for r in waiting if r.role})
    if len(roles) == 1:
        who = f"the {roles[0]}'s ranks"
    elif roles:
        who = "the " + " and ".join(f"{r}'s" for r in roles) + " ranks"
    else:
        who = "the other ranks"
    ranks = {r.rank for r in waiting}
    groups = [g for g in analysis.groups if ranks.intersection(g.ranks)]
    if not groups:
        return who, ""
    largest = max(groups, key=lambda g: g.size)
    where = short_where(largest.frames)
    if len(groups) > 1:
        where += f" (ranks {brief_ranks(largest.ranks)}; {len(groups)} stacks in all)"
    return who, where


def with_ended_roles(
    diagnosis: Diagnosis, analysis: StackAnalysis, ended: Sequence[RoleEnded]
) -> Diagnosis:
    """The diagnosis with the roles whose Slurm job ended: the likely cause of a hang (the
    pattern becomes `role_ended`), evidence only where the stacks show progress."""
    if not ended:
        return diagnosis
    who, where = waiting_where(analysis, [e.role for e in ended])
    first = ended[0]
    cause = first.ended() + (f" while {who} wait in {where}" if where else f" while {who} wait")
    evidence = [ENDED_PREFIX + e.ended() + " while the job's other roles still run" for e in ended]
    suggestion = (
        f"find why role {first.role}'s job ended: `sacct -j {first.job_id} -o "
        "JobID,State,ExitCode,NodeList,End` and the role's log; the other roles wait for "
        "it, so the job needs a restart once the cause is fixed"
    )
    if diagnosis.pattern in NOT_HUNG:
        return replace(diagnosis, evidence=evidence + diagnosis.evidence,
                       suggestions=[*diagnosis.suggestions, suggestion])  # fmt: skip
    others = "; ".join(e.ended() for e in ended[1:])
    detail = (f"{cause}{'; also ' + others if others else ''}. The stacks alone: "
              f"{diagnosis.title}. {diagnosis.detail}")  # fmt: skip
    return replace(
        diagnosis,
        pattern=ROLE_ENDED,
        title=f"Likely cause: {cause}",
        detail=detail.strip(),
        evidence=evidence + diagnosis.evidence,
        suggestions=[suggestion, *diagnosis.suggestions],
    )


def with_idle_gpus(diagnosis: Diagnosis, idle: Sequence[GpuIdle]) -> Diagnosis:
    """The diagnosis with the ranks whose GPU idled while the others' were busy: evidence
    always; where the stacks tell the ranks no apart (all in one collective, a mismatch,
    nothing), the title names the idle rank as the one the others probably wait for (a
    rank waiting in an NCCL collective keeps its GPU busy spinning)."""
    if not idle:
        return diagnosis
    evidence = [IDLE_PREFIX + g.describe() for g in idle[:8]]
    diagnosis = replace(diagnosis, evidence=evidence + diagnosis.evidence)
    if diagnosis.pattern not in ALIKE:
        return diagnosis
    ranks = sorted({g.rank for g in idle})
    who = (
        f"rank {ranks[0]}'s GPU idles"
        if len(ranks) == 1
        else f"ranks {brief_ranks(ranks)}' GPUs idle"
    )
    title = f"{diagnosis.title}; {who} while the others' are busy: they likely wait on it"
    suggestion = (
        f"look at what rank {ranks[0]} does (its stack above, `py-spy dump --pid "
        f"{idle[0].pid or 'PID'}` on {idle[0].node}): a rank whose GPU idles while the "
        "others' spin in a collective is the one they wait for"
    )
    return replace(diagnosis, title=title, suggestions=[suggestion, *diagnosis.suggestions])


def with_slow_evidence(diagnosis: Diagnosis, analysis: StackAnalysis) -> Diagnosis:
    """`diagnosis` with the capture's ended roles and idle GPUs."""
    capture = analysis.capture
    diagnosis = with_idle_gpus(diagnosis, idle_gpus(capture.idle_gpus))
    return with_ended_roles(diagnosis, analysis, ended_roles(capture.ended_roles))
