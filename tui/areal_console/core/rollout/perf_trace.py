"""Where each rank is in its step, from AReaL's perf tracer files.

AReaL's PerfTracer (areal/utils/perf_tracer.py at cbff54d) appends Chrome-trace events as
JSON lines to `<fileroot>/logs/<user>/<experiment>/<trial>/perf_tracer[/<role>]/
traces-r{rank}.jsonl` (:200-244, :143-145): complete spans `{"name", "ph": "X", "ts",
"dur", "pid", "tid", "cat", "args": {"global_step", "rank", "role", ...}}` with `ts` in
microseconds since the tracer started (:1670-1707, :1778-1782), and `"ph": "M"`
metadata. A span is written only once it has ended, and the events reach the file at
`save(step=...)`, which the trainer calls once per step (areal/trainer/rl_trainer.py:1049).

So a file tells the last span each rank finished and when the file last grew (its
mtime); the span a rank is in now is the one that followed that span in the rank's
previous step (in a one-step-per-save file: the step's first span). Its age is the
time since the last write. A rank is a straggler when its last finished step is behind
the other ranks of its role, or it has been silent far longer than they have.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_console.core.common.guarded_read import open_guarded
from areal_console.core.common.rankset import format_ranks

TRACE_FILE = re.compile(r"^traces-r(\d{1,6})\.jsonl$")
SESSION_FILE = re.compile(r"^sessions-r(\d{1,6})\.jsonl$")
MAX_TAIL = 1 << 20  # bytes read from the end of each file
MAX_EVENT = 1 << 16  # a longer line is skipped
MAX_STEP = 1 << 53
MAX_FILES = 4096
STRAGGLER_AGE = 60.0  # seconds silent beyond the median before the age alone counts
TRACER_CONFIG = "perf_tracer.enabled=true perf_tracer.session_tracer.enabled=true"


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    ts: int
    dur: int
    step: int | None


@dataclass(frozen=True, slots=True)
class RankProgress:
    """What one rank's trace file says."""

    role: str | None
    rank: int
    last: Span | None  # the last span it finished (the latest end)
    order: tuple[str, ...]  # top-level span names of its last finished step, in order
    written_at: float  # the file's mtime


@dataclass(frozen=True, slots=True)
class RankPhase:
    role: str | None
    rank: int
    span: str | None  # the span it is in now (inferred: see the module docstring)
    step: int | None
    age_s: float
    straggler: bool
    after: str | None  # the span it finished last

    def to_json(self) -> dict[str, Any]:
        return {
            "span": self.span,
            "age_s": round(self.age_s, 1),
            "straggler": self.straggler,
            "step": self.step,
            "after": self.after,
            "role": self.role,
        }

    @classmethod
    def from_json(cls, raw: Any, rank: Any = None) -> RankPhase | None:
        """From a saved capture's `ranks[].phase` (None: absent or not one)."""
        if not isinstance(raw, dict):
            return None
        span, after, role = raw.get("span"), raw.get("after"), raw.get("role")
        step, age = raw.get("step"), raw.get("age_s")
        return cls(
            role if isinstance(role, str) else None,
            rank if type(rank) is int else -1,
            span[:200] if isinstance(span, str) else None,
            step if type(step) is int else None,
            float(age) if isinstance(age, int | float) and not isinstance(age, bool) else 0.0,
            raw.get("straggler") is True,
            after[:200] if isinstance(after, str) else None,
        )


def parse_spans(lines: Iterable[str]) -> list[Span]:
    """Complete spans from trace lines; metadata, instants and junk are skipped."""
    spans = []
    for line in lines:
        if len(line) > MAX_EVENT or '"X"' not in line:
            continue
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")
        if not isinstance(name, str) or type(ts) is not int or type(dur) is not int:
            continue
        args = ev.get("args")
        step = args.get("global_step") if isinstance(args, dict) else None
        # A step is a count: a negative or 4,000-digit one is none (it became the
        # trainer's version and every server's "lag").
        known = type(step) is int and 0 <= step < MAX_STEP
        spans.append(Span(name[:200], ts, max(dur, 0), step if known else None))
    return spans


def top_level(spans: list[Span]) -> list[Span]:
    """Spans not inside another, by start time."""
    out: list[Span] = []
    end = -1
    for s in sorted(spans, key=lambda s: (s.ts, -s.dur)):
        if s.ts >= end:
            out.append(s)
            end = s.ts + s.dur
    return out


def progress(role: str | None, rank: int, lines: Iterable[str], written_at: float) -> RankProgress:
    spans = parse_spans(lines)
    if not spans:
        return RankProgress(role, rank, None, (), written_at)
    last = max(spans, key=lambda s: s.ts + s.dur)
    steps = [s.step for s in spans if s.step is not None]
    if steps:
        # The cycle of a whole step: the one before the last (the last may be partial).
        known = sorted(set(steps))
        full = known[-2] if len(known) > 1 else known[-1]
        in_step = [s for s in spans if s.step == full]
    else:
        in_step = spans
    order = tuple(s.name for s in top_level(in_step))
    return RankProgress(role, rank, last, order, written_at)


def phases(ranks: list[RankProgress], now: float) -> list[RankPhase]:
    """Each rank's current span, age and straggler mark (compared within its role)."""
    import statistics  # 2 ms to import (fractions, decimal): only captures with traces

    out = []
    by_role: dict[str | None, list[RankProgress]] = {}
    for p in ranks:
        by_role.setdefault(p.role, []).append(p)
    for role_ranks in by_role.values():
        steps = [p.last.step for p in role_ranks if p.last is not None and p.last.step is not None]
        top = max(steps) if steps else None
        ages = [max(0.0, now - p.written_at) for p in role_ranks]
        median_age = statistics.median(ages) if ages else 0.0
        for p, age in zip(role_ranks, ages, strict=True):
            span = step = after = None
            if p.last is not None:
                after = p.last.name
                span, wrapped = _next_span(p.order, p.last.name)
                if p.last.step is not None:
                    step = p.last.step + 1 if wrapped else p.last.step
            behind = top is not None and p.last is not None and (p.last.step or 0) < top
            silent = len(role_ranks) > 1 and age > median_age + STRAGGLER_AGE
            missing = p.last is None and top is not None
            out.append(
                RankPhase(p.role, p.rank, span, step, age, behind or silent or missing, after)
            )
    out.sort(key=lambda ph: (ph.role or "", ph.rank))
    return out


def _next_span(order: tuple[str, ...], last: str) -> tuple[str | None, bool]:
    """The span after `last` in a step's order, and whether it starts the next step."""
    if not order:
        return None, True
    if last in order:
        i = len(order) - 1 - order[::-1].index(last)
        return order[(i + 1) % len(order)], i + 1 == len(order)
    return order[0], True


def read_tail(path: Path, limit: int = MAX_TAIL) -> tuple[list[str], float]:
    """The last `limit` bytes of a regular file, as whole lines, and its mtime; opened
    without following links (OSError: not a regular file, or unreadable)."""
    fd = open_guarded(path)
    try:
        st = os.fstat(fd)
        start = max(0, st.st_size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, limit)
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if start > 0:
        lines = lines[1:]  # the first is a partial line
    return lines, st.st_mtime


def find_trace_files(
    tracer_dir: Path, pattern: re.Pattern[str] = TRACE_FILE
) -> list[tuple[str | None, int, Path]]:
    """`(role, rank, path)` of `traces-r{rank}.jsonl` in the tracer dir and its role folders."""
    found: list[tuple[str | None, int, Path]] = []
    try:
        top = sorted(os.scandir(tracer_dir), key=lambda e: e.name)
    except OSError:
        return found
    for entry in top[:MAX_FILES]:
        m = pattern.match(entry.name)
        if m and entry.is_file(follow_symlinks=False):
            found.append((None, int(m.group(1)), Path(entry.path)))
        elif entry.is_dir(follow_symlinks=False):
            try:
                inner = sorted(os.scandir(entry.path), key=lambda e: e.name)
            except OSError:
                continue
            for sub in inner[:MAX_FILES]:
                m = pattern.match(sub.name)
                if m and sub.is_file(follow_symlinks=False):
                    found.append((entry.name, int(m.group(1)), Path(sub.path)))
    return found[:MAX_FILES]


def read_phases(trial_dir: Path, now: float) -> tuple[list[RankPhase], list[str]]:
    """Phases of every rank with a trace file under `trial_dir/perf_tracer`, and errors."""
    errors = []
    ranks = []
    for role, rank, path in find_trace_files(trial_dir / "perf_tracer"):
        try:
            lines, mtime = read_tail(path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            continue
        ranks.append(progress(role, rank, lines, mtime))
    return phases(ranks, now), errors


def phase_summary(ranked: list[tuple[int, RankPhase]]) -> str | None:
    """One line for a status bar: ranks by the span they are in, stragglers apart.
    `train.rollout (step 4, 20s): ranks 0,2-3 · straggler: rank 1 in train.rollout (step 3, 95s)`."""
    if not ranked:
        return None
    together: dict[tuple[str, int | None], list[tuple[int, float]]] = {}
    stragglers = []
    for rank, ph in sorted(ranked, key=lambda x: x[0]):
        if ph.straggler:
            stragglers.append((rank, ph))
        else:
            together.setdefault((ph.span or "no span", ph.step), []).append((rank, ph.age_s))
    parts = []
    for (span, step), members in sorted(together.items(), key=lambda kv: -len(kv[1]))[:3]:
        age = max(a for _, a in members)
        at = f"step {step}, " if step is not None else ""
        ranks = [r for r, _ in members]
        word = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{span} ({at}{age:.0f}s): {word} {format_ranks(ranks)}")
    for rank, ph in stragglers[:3]:
        at = f"step {ph.step}, " if ph.step is not None else ""
        parts.append(f"straggler: rank {rank} in {ph.span or 'no span'} ({at}{ph.age_s:.0f}s)")
    if len(stragglers) > 3:
        parts.append(f"{len(stragglers) - 3} more stragglers")
    return " · ".join(parts)
