"""AReaL's staleness capacity recomputed from its tracing lines and session records, and
each rank's phase from perf tracer files written as AReaL's tracer writes them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.rollout.perf_trace import (
    find_trace_files,
    parse_spans,
    phase_summary,
    phases,
    progress,
    read_phases,
    read_tail,
)
from areal_console.core.rollout.staleness import (
    SessionTally,
    capacity,
    last_counts,
    session_counts,
)
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fixtures.perf_tracer_files import (
    TRAIN_STEP,
    TranscribedPerfTracer,
    TranscribedSessionTracer,
    write_steps,
)

# As AReaL's executor logs them with rollout.enable_rollout_tracing
# (areal/infra/workflow_executor.py:399, :1241 through _rollout_stats :543-550), in
# AReaL's log format.
TRACING = [
    "20260126-03:11:02.118 WorkflowExecutor INFO: Submit rollout. enqueued: 3, running: 1, accepted: 0, rejected: 0.",
    "20260126-03:11:09.540 WorkflowExecutor INFO: Finish and accept rollout. enqueued: 0, running: 3, accepted: 1, rejected: 0.",
    "20260126-03:11:12.002 WorkflowExecutor INFO: Finish and accept rollout. enqueued: 0, running: 0, accepted: 4, rejected: 0.",
    "20260126-03:11:12.003 WorkflowExecutor INFO: Rollout results are ready!",
]


def test_tracing_lines_give_the_latest_counts() -> None:
    counts = last_counts(TRACING)
    assert counts is not None
    assert (counts.enqueued, counts.running, counts.accepted, counts.rejected) == (0, 0, 4, 0)
    assert last_counts(["Submit rollout. enqueued: x"]) is None
    assert (
        last_counts(
            ["Submit rollout. enqueued: " + "9" * 5000 + ", running: 0, accepted: 0, rejected: 0."]
        )
        is None
    )


def test_staleness_term_is_zero_when_accepted_rollouts_fill_the_version_budget() -> None:
    counts = last_counts(TRACING)
    assert counts is not None
    cap = capacity(counts, version=0, max_head_offpolicyness=0, consumer_batch_size=4)
    assert (cap.concurrency, cap.staleness, cap.capacity) == (4, 0, 0)
    assert cap.zero_terms == ("staleness",)
    assert "staleness = (0 + version 0 + 1) x 4 - (4 accepted + 0 running) = 0" in cap.explanation
    # One more version of budget: capacity is back.
    assert capacity(counts, 1, 0, 4).capacity == 4


def test_concurrency_term_with_data_parallel_scaling() -> None:
    counts = last_counts([TRACING[1]])
    assert counts is not None
    # 8 concurrent over dp 2 = 4 per worker, 3 running: 1 left; batch 8 / 2 = 4.
    cap = capacity(
        counts,
        version=2,
        max_head_offpolicyness=1,
        consumer_batch_size=8,
        max_concurrent_rollouts=8,
        dp_size=2,
    )
    assert cap.concurrency == 1 and cap.staleness == (1 + 2 + 1) * 4 - 4 and cap.zero_terms == ()
    full = capacity(
        last_counts([TRACING[1].replace("running: 3", "running: 4")]) or counts, 2, 1, 8, 8, 2
    )
    assert full.zero_terms == ("concurrency",)


def test_session_records_count_accepted_and_rejected(tmp_path: Path) -> None:
    tracer = TranscribedSessionTracer(tmp_path, 0, role="rollout", flush_threshold=2)
    for status in ("accepted", "accepted", "rejected", "failed", "accepted"):
        tracer.finish(status, reason=None if status == "accepted" else "returned_none")
    tracer.flush()
    tally = SessionTally()
    tally.add([*tracer.path.read_text().split("\n"), "not json", "[1]", "{}"])
    assert (tally.accepted, tally.rejected, tally.records, tally.skipped) == (3, 2, 5, 3)
    counts = session_counts(tally, "rank 0")
    assert counts is not None and (counts.accepted, counts.rejected, counts.running) == (3, 2, 0)
    assert not counts.running_known and counts.complete
    assert session_counts(SessionTally(), "rank 0") is None
    # From session records only a staleness term at or below zero is certain; the
    # concurrency term is not computed (running is not recorded).
    cap = capacity(counts, version=0, max_head_offpolicyness=0, consumer_batch_size=2)
    assert cap.zero_terms == ("staleness",) and "not known" in cap.explanation
    partial = session_counts(tally, "rank 0", complete=False)
    assert partial is not None and "at least 3 accepted" in capacity(partial, 0, 0, 2).explanation


def test_phases_follow_the_step_and_mark_the_rank_behind(tmp_path: Path) -> None:
    now = time.time()
    for rank in range(4):
        tracer = TranscribedPerfTracer(tmp_path, rank, role="actor", pid=1000 + rank)
        write_steps(tracer, 5 if rank != 2 else 4, mtime=now - (20 if rank != 2 else 95))
    phases, errors = read_phases(tmp_path, now)
    assert errors == []
    assert [(p.rank, p.role) for p in phases] == [(r, "actor") for r in range(4)]
    assert phases[0].span == TRAIN_STEP[0][0] and phases[0].after == "train.update_weights"
    assert phases[0].step == 5 and phases[0].age_s == pytest.approx(20, abs=1)
    assert [p.straggler for p in phases] == [False, False, True, False]
    assert phases[2].step == 4 and phases[2].age_s == pytest.approx(95, abs=1)


def test_a_silent_rank_on_the_same_step_is_a_straggler(tmp_path: Path) -> None:
    now = time.time()
    for rank, age in enumerate((5, 6, 300)):
        write_steps(TranscribedPerfTracer(tmp_path, rank), 3, mtime=now - age)
    phases, _ = read_phases(tmp_path, now)
    assert [p.straggler for p in phases] == [False, False, True]
    assert all(p.role is None for p in phases)


def test_mid_step_the_next_span_is_the_one_that_followed_before(tmp_path: Path) -> None:
    tracer = TranscribedPerfTracer(tmp_path, 0)
    write_steps(tracer, 2)
    for name, dur in TRAIN_STEP[:3]:  # save_interval > 1 style: part of step 2 written
        tracer.span(name, dur, global_step=2)
    tracer.save()
    (phase,), _ = read_phases(tmp_path, time.time())
    assert phase.after == "train.compute_advantage" and phase.span == "train.ppo_update"
    assert phase.step == 2


def test_hostile_trace_files_are_bounded(tmp_path: Path) -> None:
    tracer_dir = tmp_path / "perf_tracer"
    tracer_dir.mkdir()
    (tracer_dir / "traces-r0.jsonl").write_text(
        "[" * 100000
        + "\n"
        + '{"ph": "X", "name": 5, "ts": 1, "dur": 1}\n'
        + '{"ph": "X", "name": "a", "ts": 1.5, "dur": 1}\n'
        + "x" * (2 << 20)
        + "\n"
    )
    os.symlink("/etc/passwd", tracer_dir / "traces-r1.jsonl")
    os.mkfifo(tracer_dir / "traces-r2.jsonl")
    assert [(role, rank) for role, rank, _ in find_trace_files(tracer_dir)] == [(None, 0)]
    with pytest.raises(OSError):
        read_tail(tracer_dir / "traces-r1.jsonl")
    with pytest.raises(OSError):
        read_tail(tracer_dir / "traces-r2.jsonl")
    lines, _ = read_tail(tracer_dir / "traces-r0.jsonl")
    assert sum(len(x) for x in lines) <= 1 << 20
    assert parse_spans(lines) == []
    (phase,), errors = read_phases(tmp_path, time.time())
    assert phase.span is None and errors == []
    huge = '{"ph": "X", "name": "train.update_weights", "ts": 1, "dur": 1, "args": {"global_step": %s}}'
    spans = parse_spans([huge % ("9" * 4000), huge % "-5", huge % "7"])
    assert [s.step for s in spans] == [None, None, 7]


def test_no_tracer_dir_means_no_phases(tmp_path: Path) -> None:
    assert read_phases(tmp_path, time.time()) == ([], [])


def test_phase_summary_groups_ranks_and_names_stragglers(tmp_path: Path) -> None:
    now = time.time()
    for rank in range(4):
        write_steps(
            TranscribedPerfTracer(tmp_path, rank, role="actor"),
            5 if rank != 2 else 4,
            mtime=now - 20,
        )
    phases, _ = read_phases(tmp_path, now)
    line = phase_summary([(p.rank, p) for p in phases])
    assert (
        line
        == "train.rollout (step 5, 20s): ranks 0-1,3 · straggler: rank 2 in train.rollout (step 4, 20s)"
    )
    assert phase_summary([]) is None


@given(st.lists(st.text(max_size=300), max_size=50))
def test_tracer_and_tracing_readers_take_any_lines(lines: list[str]) -> None:
    t0 = time.perf_counter()
    spans = parse_spans(lines)
    progress_of = progress("actor", 0, lines, time.time())
    last_counts(lines)
    SessionTally().add(lines)
    assert time.perf_counter() - t0 < 5  # a wide bound (10x); speed is bench/'s
    assert len(spans) <= len(lines)
    assert progress_of.rank == 0


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "name": st.sampled_from(["train.rollout", "train.ppo_update", "x"]),
                "ph": st.sampled_from(["X", "M", "i"]),
                "ts": st.integers(min_value=-(2**70), max_value=2**70),
                "dur": st.integers(min_value=-5, max_value=2**40),
                "args": st.one_of(
                    st.none(), st.fixed_dictionaries({"global_step": st.integers(-3, 10**20)})
                ),
            }
        ),
        max_size=40,
    )
)
def test_mutated_trace_events_give_a_phase_or_none(events: list[dict[str, Any]]) -> None:
    lines = [json.dumps(e) for e in events]
    (phase,) = phases([progress(None, 0, lines, time.time() - 5)], time.time())
    assert phase.span is None or phase.span in {"train.rollout", "train.ppo_update", "x"}
    assert phase.age_s >= 0
