"""Stragglers: ranks whose phases take persistently longer than the other ranks' since
some step, from AReaL's perf tracer files (the format: core/rollout/perf_trace.py and
docs/design/areal.md).

Each rank's file gives, per phase (a span name) and step, how long the rank spent in it
(the spans of that name in the step, summed). A span's step is its `args.global_step`
(the trainer's `train.*` spans carry it, rl_trainer.py:686-1000 at cbff54d); a span
without one (a worker's `rpc.<method>` span, engine_blueprint.py:545-550, which the
controller calls once per step) counts by occurrence: its k-th span is step k.

Per step, a rank's ratio is its duration over the median of the other ranks' (of the same
role). A rank is a straggler in a phase when, from some step on, its ratio stays at or
above `threshold` (at least `persist` of those steps, and the median of them), for at
least `min_steps` steps up to the last. `since_step` is the change point: the least-squares
split of the rank's log-ratio series (core/metrics/changepoint.py), not a window's start.
A rank that was slow from its first step has no earlier step to split from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from areal_console.core.metrics.changepoint import mean_shift
from areal_console.core.rollout.perf_trace import MAX_EVENT, MAX_STEP

THRESHOLD = 1.5
MIN_STEPS = 5
PERSIST = 0.8
MAX_PHASES = 256  # span names kept per rank
MAX_STEPS = 1 << 20  # steps kept per phase
MAX_PARTIAL = MAX_EVENT  # an unterminated line longer than this is dropped

RankKey = tuple[str | None, int]  # (role, rank)


@dataclass(frozen=True, slots=True)
class Straggler:
    role: str | None
    rank: int
    phase: str
    ratio: float  # median ratio to the other ranks since `since_step`
    since_step: int
    steps: int  # steps judged since then

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "phase": self.phase,
            "ratio": round(self.ratio, 2),
            "since_step": self.since_step,
            "role": self.role,
            "steps": self.steps,
        }

    def describe(self) -> str:
        who = f"{self.role} rank {self.rank}" if self.role else f"rank {self.rank}"
        return (f"{who}: {self.phase} takes {self.ratio:.2f}x the other ranks' median "
                f"since step {self.since_step} ({self.steps} steps)")  # fmt: skip


@dataclass
class RankSpans:
    """One rank's phase durations, fed its trace file's bytes as they are read."""

    partial: bytes = b""
    counts: dict[str, int] = field(default_factory=dict)  # occurrences per name
    durations: dict[str, dict[int, float]] = field(default_factory=dict)  # name -> step -> µs

    def feed(self, data: bytes) -> None:
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_PARTIAL:
            self.partial = b""
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if len(line) > MAX_EVENT or b'"X"' not in line:
            return
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            return
        name, dur = ev.get("name"), ev.get("dur")
        if not isinstance(name, str) or type(dur) is not int or dur < 0:
            return
        name = name[:200]
        args = ev.get("args")
        step = args.get("global_step") if isinstance(args, dict) else None
        seen = self.counts.get(name)
        if seen is None and len(self.counts) >= MAX_PHASES:
            return
        self.counts[name] = (seen or 0) + 1
        if not (type(step) is int and 0 <= step < MAX_STEP):
            step = seen or 0  # the k-th span of a name without a step: step k
        per_step = self.durations.setdefault(name, {})
        if step in per_step or len(per_step) < MAX_STEPS:
            per_step[step] = per_step.get(step, 0.0) + dur


class PhaseDurations:
    """Every rank's `RankSpans`, by (role, rank)."""

    def __init__(self) -> None:
        self.ranks: dict[RankKey, RankSpans] = {}

    def feed(self, role: str | None, rank: int, data: bytes) -> None:
        self.ranks.setdefault((role, rank), RankSpans()).feed(data)

    def reset(self, role: str | None, rank: int) -> None:
        """The file was rotated or truncated: it is read again from its start."""
        self.ranks[(role, rank)] = RankSpans()

    def table(self) -> dict[RankKey, dict[str, dict[int, float]]]:
        return {key: spans.durations for key, spans in self.ranks.items()}


def ratios_to_others(values: np.ndarray) -> np.ndarray:
    """`values` is ranks x steps (NaN: no span); each finite entry over the median of the
    other ranks' finite entries at that step (NaN where no other rank has one)."""
    n_steps = values.shape[1]
    out = np.full(values.shape, np.nan)
    for j in range(n_steps):
        col = values[:, j]
        present = np.flatnonzero(np.isfinite(col))
        m = len(present)
        if m < 2:
            continue
        order = present[np.argsort(col[present], kind="stable")]
        ranked = col[order]
        # The median of the m - 1 others: the sorted list with one entry taken out.
        p = np.arange(m)  # each present rank's position in the sorted list
        r = m - 1
        lo, hi = (r - 1) // 2, r // 2
        a = np.where(lo < p, lo, lo + 1)
        b = np.where(hi < p, hi, hi + 1)
        median = (ranked[a] + ranked[b]) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            out[order, j] = np.where(median > 0, ranked / median, np.nan)
    return out


def _onset(
    ratios: np.ndarray, threshold: float, min_steps: int, persist: float
) -> tuple[int, float] | None:
    """Where a rank's ratio series became persistently >= threshold up to its end: the
    index of the change and the median ratio since (None: it did not)."""
    if len(ratios) < min_steps:
        return None
    logs = np.log(np.maximum(ratios, 1e-9))
    lo = 0
    while len(ratios) - lo >= min_steps:
        tail = ratios[lo:]
        k = mean_shift(logs[lo:], min_size=1) if len(tail) >= 2 else None
        start = lo if k is None else lo + k
        if len(ratios) - start < min_steps:
            start = lo  # the split is too near the end: judge the whole stretch
        since = ratios[start:]
        slow = bool(np.mean(since >= threshold) >= persist and np.median(since) >= threshold)
        before = ratios[lo:start]
        if slow:
            if len(before) and np.median(before) >= threshold:
                start = lo  # slow before the split too: no change inside this stretch
                since = ratios[start:]
                if not (np.mean(since >= threshold) >= persist):
                    return None
            return start, float(np.median(since))
        if start == lo:
            return None
        lo = start  # the latest stretch may hold a later change
    return None


def find_stragglers(
    table: Mapping[RankKey, Mapping[str, Mapping[int, float]]],
    threshold: float = THRESHOLD,
    min_steps: int = MIN_STEPS,
    persist: float = PERSIST,
) -> list[Straggler]:
    """Stragglers in each (role, phase) with at least two ranks, slowest first."""
    groups: dict[tuple[str | None, str], dict[int, Mapping[int, float]]] = {}
    for (role, rank), phases in table.items():
        for phase, per_step in phases.items():
            groups.setdefault((role, phase), {})[rank] = per_step
    out = []
    for (role, phase), by_rank in groups.items():
        if len(by_rank) < 2:
            continue
        ranks = sorted(by_rank)
        steps = sorted({s for per_step in by_rank.values() for s in per_step})
        if len(steps) < min_steps:
            continue
        column = {s: j for j, s in enumerate(steps)}
        values = np.full((len(ranks), len(steps)), np.nan)
        for i, rank in enumerate(ranks):
            for s, d in by_rank[rank].items():
                values[i, column[s]] = d
        ratios = ratios_to_others(values)
        for i, rank in enumerate(ranks):
            have = np.flatnonzero(np.isfinite(ratios[i]))
            found = _onset(ratios[i][have], threshold, min_steps, persist)
            if found is None:
                continue
            start, ratio = found
            if math.isfinite(ratio):
                out.append(Straggler(role, rank, phase, ratio, steps[int(have[start])],
                                     len(have) - start))  # fmt: skip
    out.sort(key=lambda s: (-s.ratio, s.role or "", s.rank, s.phase))
    return out
