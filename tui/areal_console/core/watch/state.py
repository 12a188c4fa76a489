"""The watch's decisions, as pure functions: from what one look at the job saw to the
events it raises and whether to capture evidence now.

An episode is one life of the job: the set of its processes (`node:pid`). Within an
episode the phases go

    healthy --stall--> stalled --evidence--> evidence --recovered--> healthy
    any phase --(the job's processes gone)--> gone

A job whose processes come back with new PIDs (a restart of the same job) is a new
episode. Nothing here reads a clock, a file or a node: the loop (`loop.py`) gives each
look its time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from areal_console.core.metrics.health import HealthThresholds, StallState, stall_state

Phase = Literal["waiting", "healthy", "stalled", "evidence", "gone"]
EventKind = Literal["stall", "evidence", "recovered", "gone"]
PHASES: tuple[str, ...] = ("waiting", "healthy", "stalled", "evidence", "gone")


@dataclass(frozen=True)
class WatchConfig:
    stall_after: float
    """No new step for this long (or stacks unchanged this long while no step came) is a stall."""
    interval: float
    """Seconds between looks at the job."""


@dataclass(frozen=True)
class Look:
    """What one look at the job saw."""

    at: float
    """When (the console's wall clock, seconds)."""
    pids: frozenset[str] | None
    """The job's processes (`node:pid`); empty: none runs; None: not known (a node of the
    job did not answer)."""
    steps: int | None = None
    """Steps the job has logged so far; None: no log is followed."""
    quiet_for: float | None = None
    """Seconds since the log's last step (the log's own clock); None: no step logged yet."""
    finished: bool = False
    """The log says the run completed: quiet is not a stall."""
    stacks: str | None = None
    """A signature of every process's stacks, when they were sampled on this look."""
    why: str = ""
    """The log's state in words (for the stall event)."""
    spans: int | None = None
    """Bytes in the job's perf-tracer files (AReaL's `perf_tracer/traces-r*.jsonl`); None:
    none found. Growing spans are work going on inside a long step: no stall."""


@dataclass(frozen=True)
class Event:
    event: EventKind
    at: float
    evidence: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class WatchState:
    phase: Phase = "waiting"
    episode: tuple[str, ...] = ()
    """The episode's processes (`node:pid`), sorted; every process seen in it."""
    episode_no: int = 0
    steps: int | None = None
    progress_at: float | None = None
    """When the job last made progress (a new step; without a log, stacks that moved)."""
    stacks: str | None = None
    stacks_since: float | None = None
    """When the stacks took the signature they still have."""
    stall_at: float | None = None
    spans: int | None = None
    active_at: float | None = None
    """When the perf-tracer files last grew."""
    evidence: str | None = None
    """The episode's latest evidence folder."""
    events: tuple[str, ...] = field(default=())
    """The kinds of event raised in this episode, in order (kept short)."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["episode"] = list(self.episode)
        doc["events"] = list(self.events)
        return doc


def state_from_json(doc: Any) -> WatchState:
    """A saved state; a file that is not one gives the initial state (never raises)."""
    if not isinstance(doc, dict):
        return WatchState()
    try:
        phase = str(doc.get("phase", "waiting"))
        if phase not in PHASES:
            return WatchState()
        if phase == "stalled":
            # The stall's evidence was never finished (stopped while capturing): the
            # stall is judged again, and its evidence taken.
            phase = "healthy"
        return WatchState(
            phase=phase,  # type: ignore[arg-type]
            episode=tuple(sorted(str(p) for p in doc.get("episode") or [])),
            episode_no=int(doc.get("episode_no") or 0),
            steps=_opt_int(doc.get("steps")),
            progress_at=_opt_float(doc.get("progress_at")),
            stacks=_opt_str(doc.get("stacks")),
            stacks_since=_opt_float(doc.get("stacks_since")),
            stall_at=_opt_float(doc.get("stall_at")),
            spans=_opt_int(doc.get("spans")),
            active_at=_opt_float(doc.get("active_at")),
            evidence=_opt_str(doc.get("evidence")),
            events=tuple(str(e) for e in (doc.get("events") or [])[-8:]),
        )
    except (TypeError, ValueError):
        return WatchState()


def _opt_int(v: Any) -> int | None:
    return None if v is None or isinstance(v, bool) else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None or isinstance(v, bool) else float(v)


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def log_quiet(
    step_times: Sequence[float],
    now: float,
    finished: bool,
    stall_after: float,
    unread_bytes: int = 0,
) -> tuple[float | None, str]:
    """Seconds since the log's last step (None: no step, finished, or not read to its end)
    and the log's state in words, as the Health view judges it with `stall_after` as the
    least quiet that counts (no multiple of the median step time: the user said how long)."""
    limits = HealthThresholds(stall_factor=0.0, stall_min_seconds=stall_after)
    judged: StallState = stall_state(step_times, now, finished, limits, unread_bytes)
    if judged.finished or judged.unread_bytes or judged.last_step_at is None:
        return None, judged.describe()
    waited = max(0.0, now - judged.last_step_at)
    if judged.median_step_seconds is None and waited > stall_after:
        return waited, f"stalled: no new step for {waited:.0f}s"
    return waited, judged.describe()


def wants_stacks(
    state: WatchState, quiet_for: float | None, follows_log: bool, interval: float
) -> bool:
    """Sample the stacks on this look? Only while the log is quiet (no step for an
    interval), and only where they can tell something: before a stall, or (without a log)
    to see a stalled job move again."""
    if state.phase in ("waiting", "gone"):
        return True  # a new episode starts healthy: its first look may sample
    if follows_log:
        return state.phase == "healthy" and (quiet_for is None or quiet_for >= interval)
    return True


def observe(
    state: WatchState, look: Look, config: WatchConfig
) -> tuple[WatchState, list[Event], bool]:
    """The state after `look`, the events it raises, and whether evidence is to be taken now."""
    if look.pids is None:
        return state, [], False  # a node of the job did not answer: nothing is judged
    events: list[Event] = []
    if not look.pids:
        if state.phase in ("waiting", "gone"):
            return state, [], False
        gone = Event("gone", look.at, state.evidence, "the job's processes are gone")
        return _with_event(replace(state, phase="gone"), gone), [gone], False
    if state.phase in ("waiting", "gone") or not set(state.episode) & look.pids:
        if state.phase not in ("waiting", "gone"):
            gone = Event("gone", look.at, state.evidence, "the job's processes are gone "
                         "(new processes of it run)")  # fmt: skip
            events.append(gone)
        state = new_episode(state, look)
    else:
        state = replace(state, episode=tuple(sorted(set(state.episode) | look.pids)))
    progressed = look.steps is not None and state.steps is not None and look.steps > state.steps
    if look.steps is not None:
        state = replace(state, steps=look.steps)
    if look.spans is not None:
        grew = state.spans is not None and look.spans > state.spans
        state = replace(state, spans=look.spans, active_at=look.at if grew else state.active_at)
    if look.stacks is not None and look.stacks != state.stacks:
        moved = state.stacks is not None
        state = replace(state, stacks=look.stacks, stacks_since=look.at)
        progressed = progressed or (moved and look.steps is None)
    if progressed:
        state = replace(state, progress_at=look.at)
        if state.phase in ("stalled", "evidence"):
            recovered = Event("recovered", look.at, state.evidence, "the job makes progress again")
            state = _with_event(replace(state, phase="healthy", stall_at=None), recovered)
            events.append(recovered)
        return state, events, False
    if state.phase != "healthy":
        return state, events, False
    why = stall_reason(state, look, config)
    if why is None:
        return state, events, False
    stall = Event("stall", look.at, None, why)
    state = _with_event(replace(state, phase="stalled", stall_at=look.at), stall)
    return state, [*events, stall], True


def new_episode(state: WatchState, look: Look) -> WatchState:
    """The first look at a (new) life of the job: healthy, its progress dated from the
    log's last step when there is one."""
    assert look.pids is not None
    since = look.at - look.quiet_for if look.quiet_for is not None else look.at
    return WatchState(
        phase="healthy",
        episode=tuple(sorted(look.pids)),
        episode_no=state.episode_no + 1,
        steps=look.steps,
        progress_at=since,
    )


def stall_reason(state: WatchState, look: Look, config: WatchConfig) -> str | None:
    """Why this look is a stall, or None: no new step for `stall_after` (the log), or
    stacks unchanged across samples for `stall_after` while no step came."""
    if look.finished:
        return None
    if state.active_at is not None and look.at - state.active_at <= config.stall_after:
        return None  # the perf tracer still records spans: a long step, not a stall
    if look.quiet_for is not None and look.quiet_for > config.stall_after:
        return look.why or f"no new step for {look.quiet_for:.0f}s"
    if (
        look.stacks is not None
        and state.stacks_since is not None
        and look.stacks == state.stacks
        and look.at - state.stacks_since >= config.stall_after
        and (state.progress_at is None or state.progress_at <= state.stacks_since)
    ):
        return f"stacks unchanged for {look.at - state.stacks_since:.0f}s and no new step"
    return None


def evidence_taken(
    state: WatchState, folder: str, at: float, detail: str = ""
) -> tuple[WatchState, Event]:
    """The stall's evidence is in `folder`."""
    event = Event("evidence", at, folder, detail)
    phase: Phase = "evidence" if state.phase == "stalled" else state.phase
    return _with_event(replace(state, phase=phase, evidence=folder), event), event


def _with_event(state: WatchState, event: Event) -> WatchState:
    return replace(state, events=(*state.events, event.event)[-8:])


def same_episode(saved: WatchState, pids: Iterable[str]) -> bool:
    """Whether processes seen now are the saved episode's (a restart of the watch, not of
    the job)."""
    return bool(set(saved.episode) & set(pids))
