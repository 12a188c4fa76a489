"""Stragglers from AReaL's perf tracer files: per-rank phase durations per step, the ratio
to the other ranks' median, and the step it changed (the files written by a transcription
of AReaL's writer, tests/support/fixtures/perf_tracer_files.py)."""

from __future__ import annotations

import getpass
import json
import math
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.transport import LocalChannel
from areal_console.core.metrics.changepoint import mean_shift, trend_shift, variance_shift
from areal_console.core.metrics.follow import MetricsFollower, NodeFiles
from areal_console.core.metrics.report import build_report
from areal_console.core.metrics.store import MetricStore
from areal_console.core.rollout.stragglers import (
    PhaseDurations,
    RankSpans,
    find_stragglers,
    ratios_to_others,
)
from areal_console.widgets.health_banner import banner_text

from tests.conftest import run_cli
from tests.support.areal_logfmt import write_run
from tests.support.areal_name_resolve import nfs_add, worker_key
from tests.support.fixtures.perf_tracer_files import TranscribedPerfTracer, write_rank_run


def test_one_rank_slowed_from_step_30_is_named_with_its_change_point(tmp_path: Path) -> None:
    write_run(tmp_path, 60)
    write_rank_run(tmp_path, 4, 60, slow={2: ("train.ppo_update", 30, 2.0)}, noise=0.1)
    result = run_cli("metrics", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    stragglers = json.loads(result.stdout)["stragglers"]
    assert len(stragglers) == 1, stragglers
    s = stragglers[0]
    found = (s["rank"], s["phase"], s["since_step"], s["role"])
    assert found == (2, "train.ppo_update", 30, "master")
    assert 1.7 < s["ratio"] < 2.3 and s["steps"] == 30
    text = run_cli("metrics", str(tmp_path))
    assert "straggler: master rank 2: train.ppo_update takes" in text.stdout
    assert "since step 30" in text.stdout


@pytest.mark.parametrize("since", [5, 30, 52])
def test_the_change_point_is_the_step_the_rank_slowed_not_a_windows_start(
    tmp_path: Path, since: int
) -> None:
    write_rank_run(tmp_path, 8, 60, slow={5: ("train.rollout", since, 1.8)}, noise=0.1, seed=3)
    found = _stragglers(tmp_path)
    assert [(s.rank, s.phase, s.since_step) for s in found] == [(5, "train.rollout", since)]


def test_a_rank_slow_from_its_first_step(tmp_path: Path) -> None:
    write_rank_run(tmp_path, 4, 40, slow={0: ("train.update_weights", 0, 3.0)}, noise=0.1)
    found = _stragglers(tmp_path)
    assert [(s.rank, s.since_step, round(s.ratio)) for s in found] == [(0, 0, 3)]


@pytest.mark.parametrize("seed", range(6))
def test_a_noise_only_run_names_no_one(tmp_path: Path, seed: int) -> None:
    """Log-normal jitter of sd 0.25 on every span: single steps over 1.5x happen, a
    persistent run of them does not."""
    write_rank_run(tmp_path, 8, 100, noise=0.25, seed=seed)
    durations = _durations(tmp_path)
    ratios = [
        per_step[s] / per_step_0[s]
        for (_, rank), phases in durations.table().items()
        for per_step in [phases["train.rollout"]]
        for per_step_0 in [durations.table()[("master", (rank + 1) % 8)]["train.rollout"]]
        for s in per_step
    ]
    assert max(ratios) >= 1.5  # the noise does cross the threshold on single steps
    assert find_stragglers(durations.table()) == []


def test_a_brief_slowdown_that_recovered_is_not_a_straggler(tmp_path: Path) -> None:
    tracers = [TranscribedPerfTracer(tmp_path, r, role="actor") for r in range(4)]
    for step in range(50):
        for rank, tracer in enumerate(tracers):
            slow = rank == 1 and 20 <= step < 30
            tracer.span("train.ppo_update", 2_000_000 * (3 if slow else 1) + rank, global_step=step)
            tracer.save()
    assert _stragglers(tmp_path) == []


def test_worker_spans_without_a_step_count_by_occurrence(tmp_path: Path) -> None:
    """A single-controller worker's `rpc.<method>` span carries `method` and `engine`,
    not the step (engine_blueprint.py:545-550): its k-th span is step k."""
    tracers = [TranscribedPerfTracer(tmp_path, r, role="actor", pid=100 + r) for r in range(4)]
    for step in range(40):
        for rank, tracer in enumerate(tracers):
            factor = 2.5 if rank == 3 and step >= 12 else 1.0 + 0.01 * ((step * 7 + rank) % 5)
            with_rpc = {"method": "ppo_update", "engine": "actor"}
            tracer.span("fsdp_engine.forward", int(300_000 * factor))
            tracer.span("fsdp_engine.forward", int(300_000 * factor))
            tracer.span("rpc.ppo_update", int(900_000 * factor), category="compute", **with_rpc)
            tracer.save()
    found = {(s.role, s.rank, s.phase): s for s in _stragglers(tmp_path)}
    assert set(found) == {("actor", 3, "rpc.ppo_update"), ("actor", 3, "fsdp_engine.forward")}
    assert found[("actor", 3, "rpc.ppo_update")].since_step == 12
    # Two forwards a step: the occurrence count is not the step there.
    assert found[("actor", 3, "fsdp_engine.forward")].since_step == 24


def test_ratio_to_the_median_of_the_other_ranks() -> None:
    values = np.array([[1.0, 4.0], [2.0, np.nan], [3.0, 1.0], [10.0, 2.0]])
    ratios = ratios_to_others(values)
    # others of rank 0: 2, 3, 10 -> 3; of rank 3: 1, 2, 3 -> 2; rank 1 has no span at step 1.
    assert ratios[:, 0].tolist() == [1 / 3, 2 / 3, 3 / 2.0, 10 / 2]
    assert ratios[0, 1] == 4 / 1.5 and math.isnan(ratios[1, 1]) and ratios[3, 1] == 2 / 2.5


def test_trace_lines_that_are_not_spans_are_skipped() -> None:
    spans = RankSpans()
    good = {"name": "a", "ph": "X", "ts": 0, "dur": 5, "args": {"global_step": 1}}
    spans.feed(b'{"name": "x", "ph": "M"}\nnot json "X"\n[1, "X"]\n')
    spans.feed(json.dumps({**good, "dur": -1}).encode() + b"\n")
    spans.feed(json.dumps({**good, "args": {"global_step": -4}}).encode() + b"\n")
    spans.feed(b'{"ph": "X", "name": "' + b"y" * 70_000 + b'", "dur": 1}\n')
    line = json.dumps(good).encode()
    spans.feed(line[:10])  # a line written in two pieces
    spans.feed(line[10:] + b"\n")
    # the negative step counts as the name's first occurrence (step 0)
    assert spans.durations == {"a": {0: 5.0, 1: 5.0}}


def test_the_follower_reads_trace_files_through_the_agent_as_they_grow(tmp_path: Path) -> None:
    write_run(tmp_path, 3)
    tracers = [TranscribedPerfTracer(tmp_path, r, role="master") for r in range(3)]

    def steps(a: int, b: int) -> None:
        for step in range(a, b):
            for rank, tracer in enumerate(tracers):
                slow = 2.0 if rank == 0 and step >= 15 else 1.0
                tracer.span("train.rollout", int((1_000_000 + 1000 * (step % 3)) * slow),
                            global_step=step)  # fmt: skip
                tracer.save()

    client = AgentClient(LocalChannel())
    client.start()
    try:
        session = _Session(client)
        steps(0, 15)
        found = client.request("log_find", {"path": str(tmp_path)})
        assert sorted((t["role"], t["rank"]) for t in found["traces"]) == [
            ("master", 0), ("master", 1), ("master", 2)]  # fmt: skip
        follower = MetricsFollower(str(tmp_path), NodeFiles(session))
        follower.poll()
        assert follower.stragglers() == []
        steps(15, 30)
        follower.poll()
        [s] = follower.report().stragglers
        assert (s.rank, s.since_step) == (0, 15)
    finally:
        client.close()


def test_trace_files_found_only_as_regular_files_of_the_owner(tmp_path: Path) -> None:
    from areal_node.agent.logs import find_traces

    write_rank_run(tmp_path, 2, 3)
    (tmp_path / "perf_tracer" / "evil").mkdir()
    os.symlink("/etc/passwd", tmp_path / "perf_tracer" / "evil" / "traces-r7.jsonl")
    os.mkfifo(tmp_path / "perf_tracer" / "traces-r9.jsonl")
    (tmp_path / "perf_tracer" / "traces-rx.jsonl").write_text("")
    found = find_traces(str(tmp_path))
    assert [(t["role"], t["rank"]) for t in found] == [("master", 0), ("master", 1)]
    assert find_traces(str(tmp_path), owner=os.getuid() + 1) == []


def test_metrics_areal_reads_the_jobs_trace_files(tmp_path: Path) -> None:
    user, experiment, trial = getpass.getuser(), "gsm8k", "t1"
    records = tmp_path / "name_resolve"
    worker = socket.create_server(("127.0.0.1", 0))  # the worker's rpc_server port, live
    port = worker.getsockname()[1]
    nfs_add(str(records), worker_key(user, experiment, trial, "actor", 0), f"127.0.0.1:{port}")
    log_dir = tmp_path / "root" / "logs" / user / experiment / trial
    write_run(log_dir, 40)
    write_rank_run(log_dir, 4, 40, slow={1: ("train.ppo_update", 25, 2.0)}, noise=0.05)
    with worker:
        result = run_cli("metrics", "--areal", f"{experiment}/{trial}", "--name-resolve-root",
                         str(records), "--fileroot", str(tmp_path / "root"), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    stragglers = json.loads(result.stdout)["stragglers"]
    assert [(s["rank"], s["phase"], s["since_step"]) for s in stragglers] == [
        (1, "train.ppo_update", 25)]  # fmt: skip


def test_the_health_banner_lists_stragglers(tmp_path: Path) -> None:
    write_rank_run(tmp_path, 4, 40, slow={3: ("train.rollout", 20, 2.0)}, noise=0.05)
    report = build_report("x", MetricStore(), False, 0.0, stragglers=_stragglers(tmp_path))
    text = banner_text(report).plain  # type: ignore[union-attr]
    assert "⏱ straggler: master rank 3: train.rollout takes" in text
    assert "since step 20" in text


def test_change_points() -> None:
    rng = np.random.default_rng(0)
    level = np.concatenate((rng.normal(0, 0.1, 17), rng.normal(1, 0.1, 13)))
    assert mean_shift(level) == 17
    trend = np.concatenate((np.full(12, 5.0), 5.0 + 0.5 * np.arange(1, 19)))
    trend += rng.normal(0, 0.05, 30)
    assert trend_shift(trend) in (11, 12, 13)
    noise = np.concatenate((rng.normal(0, 0.01, 20), rng.normal(0, 0.5, 20)))
    assert variance_shift(noise) in (19, 20, 21)
    assert mean_shift([1.0]) is None and trend_shift([1.0] * 5) is None


class _Session:
    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.name = "node0"

    def call(self, op, args=None, timeout=30.0):  # type: ignore[no-untyped-def]
        return self.client.request(op, args, timeout=timeout)


def _durations(trial_dir: Path) -> PhaseDurations:
    from areal_node.agent.logs import find_traces

    durations = PhaseDurations()
    for t in find_traces(str(trial_dir)):
        durations.feed(t["role"], t["rank"], Path(t["path"]).read_bytes())
    return durations


def _stragglers(trial_dir: Path) -> list:  # type: ignore[type-arg]
    return find_stragglers(_durations(trial_dir).table())
