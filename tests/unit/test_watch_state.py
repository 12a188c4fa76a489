"""The watch's decisions (core/watch/state.py): pure, from looks to events."""

from __future__ import annotations

from areal_console.core.stacks.records import Frame, RankStack, Thread
from areal_console.core.watch.loop import stacks_signature
from areal_console.core.watch.state import (
    Look,
    WatchConfig,
    WatchState,
    evidence_taken,
    log_quiet,
    observe,
    state_from_json,
    wants_stacks,
)

CONFIG = WatchConfig(stall_after=60.0, interval=10.0)
JOB = frozenset({"n1:100", "n1:101"})


def run(looks: list[Look], state: WatchState | None = None) -> tuple[WatchState, list[str], int]:
    """Every look in turn: the last state, the events' kinds, how many captures were asked."""
    state = state or WatchState()
    kinds: list[str] = []
    captures = 0
    for look in looks:
        state, events, capture = observe(state, look, CONFIG)
        kinds += [e.event for e in events]
        if capture:
            captures += 1
            state, event = evidence_taken(state, f"/ev/{look.at:.0f}", look.at)
            kinds.append(event.event)
    return state, kinds, captures


def steady(start: float, end: float, every: float = 10.0) -> list[Look]:
    """A healthy job: a step per look."""
    looks, t, steps = [], start, 0
    while t <= end:
        steps += 1
        looks.append(Look(t, JOB, steps, 1.0))
        t += every
    return looks


def test_a_healthy_job_raises_nothing() -> None:
    state, kinds, captures = run(steady(0, 3600))
    assert kinds == [] and captures == 0 and state.phase == "healthy"


def test_a_quiet_log_is_a_stall_with_evidence_once_then_recovery() -> None:
    looks = steady(0, 100)
    steps = looks[-1].steps
    looks += [Look(100 + t, JOB, steps, float(t), why="stalled") for t in range(10, 200, 10)]
    state, kinds, captures = run(looks)
    assert kinds == ["stall", "evidence"] and captures == 1  # once, however long it stays
    assert state.phase == "evidence" and state.evidence == "/ev/170"
    state, kinds, _ = run([Look(400, JOB, (steps or 0) + 1, 0.5)], state)
    assert kinds == ["recovered"] and state.phase == "healthy"


def test_the_stall_fires_after_stall_after_and_not_before() -> None:
    state, kinds, _ = run([Look(0, JOB, 5, 0.0), Look(60, JOB, 5, 60.0)])
    assert kinds == []  # 60 s quiet is not more than 60 s
    state, kinds, _ = run([Look(61, JOB, 5, 61.0)], state)
    assert kinds == ["stall", "evidence"]


def test_a_finished_run_is_not_a_stall() -> None:
    _, kinds, _ = run([Look(0, JOB, 5, 0.0), Look(500, JOB, 5, 500.0, finished=True)])
    assert kinds == []


def test_without_a_log_unchanged_stacks_are_a_stall_and_moving_ones_recover() -> None:
    looks = [Look(t, JOB, stacks="A") for t in range(0, 70, 10)]
    state, kinds, _ = run(looks)
    assert kinds == ["stall", "evidence"]
    state, kinds, _ = run([Look(80, JOB, stacks="B")], state)
    assert kinds == ["recovered"]


def test_changing_stacks_without_a_log_are_no_stall() -> None:
    looks = [Look(t, JOB, stacks="AB"[(t // 10) % 2]) for t in range(0, 600, 10)]
    _, kinds, _ = run(looks)
    assert kinds == []


def test_gone_keeps_the_evidence_and_new_pids_are_a_new_episode() -> None:
    looks = [Look(0, JOB, 5, 0.0), Look(70, JOB, 5, 70.0), Look(80, frozenset())]
    state, kinds, _ = run(looks)
    assert kinds == ["stall", "evidence", "gone"]
    assert state.phase == "gone" and state.evidence == "/ev/70"
    state, kinds, _ = run([Look(90, frozenset())], state)
    assert kinds == []  # gone once
    state, kinds, _ = run([Look(100, frozenset({"n1:200"}), 0, None)], state)
    assert kinds == [] and state.episode == ("n1:200",) and state.episode_no == 2
    assert state.evidence is None and state.phase == "healthy"


def test_a_restart_of_the_job_without_a_gap_ends_the_old_episode() -> None:
    state, _, _ = run([Look(0, JOB, 5, 0.0), Look(70, JOB, 5, 70.0)])
    state, kinds, _ = run([Look(80, frozenset({"n1:300"}), 1, 1.0)], state)
    assert kinds == ["gone"] and state.episode_no == 2


def test_an_unknown_look_judges_nothing() -> None:
    state, _, _ = run([Look(0, JOB, 5, 0.0)])
    after, kinds, _ = run([Look(500, None, None, None)], state)
    assert kinds == [] and after == state


def test_a_restarted_watch_does_not_fire_the_same_stall_again() -> None:
    state, kinds, _ = run([Look(0, JOB, 5, 0.0), Look(70, JOB, 5, 70.0)])
    assert kinds == ["stall", "evidence"]
    saved = state_from_json(state.to_json())
    assert saved == state
    _, kinds, _ = run([Look(80, JOB, 5, 80.0), Look(90, JOB, 5, 90.0)], saved)
    assert kinds == []


def test_a_watch_stopped_while_capturing_takes_the_evidence_after_its_restart() -> None:
    state, _, _ = observe(WatchState(), Look(0, JOB, 5, 0.0), CONFIG)
    state, _, capture = observe(state, Look(70, JOB, 5, 70.0), CONFIG)
    assert capture and state.phase == "stalled"
    saved = state_from_json(state.to_json())
    _, kinds, captures = run([Look(80, JOB, 5, 80.0)], saved)
    assert kinds == ["stall", "evidence"] and captures == 1


def test_a_damaged_state_file_is_a_fresh_start() -> None:
    for doc in (None, [], {"phase": "nonsense"}, {"phase": "evidence", "episode_no": "x"}):
        assert state_from_json(doc) == WatchState()


def test_log_quiet_uses_the_health_views_judgement() -> None:
    times = [0.0, 10.0, 20.0, 30.0]
    quiet, why = log_quiet(times, 100.0, False, 60.0)
    assert quiet == 70.0 and why.startswith("stalled: no new step for 70s")
    quiet, why = log_quiet(times, 50.0, False, 60.0)
    assert quiet == 20.0 and why.startswith("progressing")
    assert log_quiet(times, 100.0, True, 60.0)[0] is None  # finished
    assert log_quiet([], 100.0, False, 60.0)[0] is None  # no step yet
    assert log_quiet(times, 100.0, False, 60.0, unread_bytes=10)[0] is None
    quiet, why = log_quiet([5.0], 100.0, False, 60.0)  # one step: no median, still judged
    assert quiet == 95.0 and why == "stalled: no new step for 95s"


def test_stacks_are_sampled_only_while_the_log_is_quiet() -> None:
    healthy = WatchState(phase="healthy")
    assert not wants_stacks(healthy, 2.0, True, 10.0)
    assert wants_stacks(healthy, 12.0, True, 10.0)
    assert not wants_stacks(WatchState(phase="evidence"), 500.0, True, 10.0)
    assert wants_stacks(WatchState(phase="evidence"), None, False, 10.0)


def test_growing_perf_tracer_spans_are_a_long_step_not_a_stall() -> None:
    looks = [Look(t, JOB, 5, float(t), spans=1000 + t) for t in range(0, 300, 10)]
    state, kinds, _ = run(looks)
    assert kinds == []  # the log is quiet for 290 s, but spans keep coming
    quiet = [Look(300 + t, JOB, 5, 300.0 + t, spans=1290) for t in range(10, 90, 10)]
    _, kinds, _ = run(quiet, state)
    assert kinds == ["stall", "evidence"]  # spans stopped too: stalled after stall_after


def _rank(pid: int, line: int, state: str = "ok") -> RankStack:
    frames = (Frame("barrier", "distributed_c10d.py", line), Frame("main", "train.py", 10))
    threads = [Thread("MainThread", pid, frames, is_main=True)] if state == "ok" else []
    return RankStack("n1", pid, rank=pid - 100, state=state, threads=threads,
                     error=None if state == "ok" else "py-spy failed")  # fmt: skip


def test_a_sample_that_missed_a_rank_is_not_compared() -> None:
    """Two ranks read give a signature that a second identical sample repeats; a sample
    where one rank's dump failed gives none (it would read as stacks that moved)."""
    both, failed = stacks_signature([_rank(100, 5), _rank(101, 5)])
    assert both is not None and failed == []
    assert stacks_signature([_rank(101, 5), _rank(100, 5)])[0] == both
    assert stacks_signature([_rank(100, 5), _rank(101, 6)])[0] not in (None, both)
    partial, failed = stacks_signature([_rank(100, 5), _rank(101, 5, state="error")])
    assert partial is None and [r.pid for r in failed] == [101]
    assert stacks_signature([]) == (None, [])
