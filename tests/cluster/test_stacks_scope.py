"""A capture takes ONE job: two real gloo jobs on this machine, only the chosen one is
dumped (py-spy pauses what it dumps: the other job must never be touched)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from areal_console.core.connection.fleet import Fleet
from areal_console.core.stacks.capture import CaptureOptions, JobChoiceError, capture_raw
from areal_console.core.stacks.scope import (
    UNSCOPED,
    choose_job,
    distinct_command,
    group_jobs,
    is_candidate,
    job_key,
)
from areal_console.core.targets.resolve import NodeSpec
from conftest import GlooJob, run_cli

from tests.support import waits
from tests.support.cluster import free_port
from tests.support.fixtures.hang import ScenarioJob, start_scenario

# --------------------------------------------------------------------------------------
# Grouping rules (pure)


def _proc(pid: int, **fields: object) -> dict[str, object]:
    return {"pid": pid, "cmdline": f"python train.py {pid}", "role": "trainer", **fields}


def test_job_key_prefers_the_most_specific_identity() -> None:
    areal = _proc(1, job="exp/t1", master_addr="10.0.0.1", master_port=1)
    assert job_key("n1", areal) == "areal:exp/t1"
    assert job_key("n1", _proc(2, master_addr="10.0.0.1", master_port=29500)) == ("10.0.0.1:29500")
    # a loopback rendezvous: one job while its ranks are distinct across nodes, one job
    # per node when the same ranks repeat (each node runs its own single-node job)
    one = {
        "n1": [_proc(3, rank=0, master_addr="127.0.0.1", master_port=29500)],
        "n2": [_proc(3, rank=1, master_addr="127.0.0.1", master_port=29500)],
    }
    assert [g.key for g in group_jobs(one)] == ["127.0.0.1:29500"]
    one["n2"][0]["rank"] = 0
    assert sorted(g.key for g in group_jobs(one)) == ["n1/127.0.0.1:29500", "n2/127.0.0.1:29500"]
    assert job_key("n1", _proc(4, torchelastic_run_id="abc")) == "torchelastic:abc"
    assert job_key("n1", _proc(5, torchelastic_run_id="none", slurm_job_id="77")) == "slurm:77"
    assert job_key("n1", _proc(6)) is None


def test_launchers_are_never_candidates() -> None:
    assert not is_candidate({"pid": 1, "role": "launcher", "rank": None})
    assert is_candidate({"pid": 2, "role": "trainer", "rank": 0})
    assert is_candidate({"pid": 3, "role": "sglang", "rank": None})
    assert is_candidate({"pid": 4, "role": "controller", "rank": None, "job": "e/t"})
    assert not is_candidate({"pid": 6, "role": "wrapper", "rank": None, "job": "e/t"})
    assert not is_candidate({"pid": 5, "role": None, "rank": None})


def test_two_jobs_need_a_choice_and_one_job_is_taken() -> None:
    sampled = {
        "n1": [
            _proc(10, rank=0, master_addr="10.0.0.1", master_port=1000),
            _proc(11, rank=1, master_addr="10.0.0.1", master_port=1000),
            _proc(20, rank=0, master_addr="10.0.0.1", master_port=2000),
            _proc(30, rank=5),  # no job identity
        ],
        "n2": [_proc(12, rank=2, master_addr="10.0.0.1", master_port=1000)],
    }
    jobs = group_jobs(sampled)
    assert [(g.key, g.count) for g in jobs] == [
        ("10.0.0.1:1000", 3),
        ("10.0.0.1:2000", 1),
        (UNSCOPED, 1),
    ]
    with pytest.raises(JobChoiceError) as err:
        choose_job(jobs)
    assert "2 jobs here" in str(err.value) and "10.0.0.1:2000" in str(err.value)
    [chosen] = choose_job(jobs, "1000")
    assert chosen.ranks == [0, 1, 2] and sorted(chosen.processes) == ["n1", "n2"]
    with pytest.raises(JobChoiceError, match="no job matches --job 'nope'"):
        choose_job(jobs, "nope")
    with pytest.raises(JobChoiceError, match="2 jobs match"):
        choose_job(jobs, "10.0.0.1")
    # one job: taken without asking; processes of no job stay out
    assert [
        g.key for g in choose_job(group_jobs({"n1": [*sampled["n1"][:2], _proc(30, rank=5)]}))
    ] == ["10.0.0.1:1000"]
    # no job at all: the processes with rank variables are all there is
    assert [g.key for g in choose_job(group_jobs({"n1": [_proc(30, rank=5)]}))] == [UNSCOPED]


def test_slurm_job_filter_and_match() -> None:
    sampled = {
        "n1": [
            _proc(10, rank=0, slurm_job_id="111", master_addr="a", master_port=1),
            _proc(20, rank=0, slurm_job_id="222", master_addr="a", master_port=2),
        ]
    }
    assert [g.key for g in group_jobs(sampled, slurm_job="222")] == ["a:2"]
    assert [g.key for g in group_jobs(sampled, match=r"train\.py 10$")] == ["a:1"]


def test_match_on_a_launcher_picks_the_ranks_it_started() -> None:
    """Two runs of one script: the ranks' command lines are the same; what tells the jobs
    apart is on the launcher's line (`torchrun --master-port 29501 hang.py`), under a
    `bash -c` wrapper for the second job."""
    launcher = {"role": "launcher", "rank": None}
    sampled = {
        "n1": [
            {"pid": 1, "cmdline": "torchrun --master-port 29501 hang.py", **launcher},
            _proc(10, ppid=1, rank=0, master_addr="localhost", master_port=29501),
            _proc(11, ppid=1, rank=1, master_addr="localhost", master_port=29501),
            {
                "pid": 2,
                "cmdline": "bash -c torchrun --master-port 29502 hang.py",
                "role": "wrapper",
            },
            {"pid": 3, "ppid": 2, "cmdline": "torchrun --master-port 29502 hang.py", **launcher},
            _proc(20, ppid=3, rank=0, master_addr="localhost", master_port=29502),
        ]
    }
    for proc in sampled["n1"]:
        if proc["pid"] in (10, 11, 20):
            proc["cmdline"] = "python -u hang.py"
    assert [g.key for g in group_jobs(sampled, match="29501")] == ["localhost:29501"]
    assert [g.key for g in group_jobs(sampled, match="29502")] == ["localhost:29502"]
    both = group_jobs(sampled, match="hang")
    with pytest.raises(JobChoiceError, match="--match 'hang' matches 2 jobs; pick one with --job"):
        choose_job(both, match="hang")


def test_a_job_list_shows_what_tells_the_jobs_apart() -> None:
    """Two runs of one script: the listing shows the argument that differs (the start of
    both lines was the same interpreter path, cut before the part that differs)."""
    a = "/home/u/venv/bin/python -u train.py --lr 1 --out=/scratch/u/runs/2026-11-29-a"
    b = "/home/u/venv/bin/python -u train.py --lr 1 --out=/scratch/u/runs/2026-11-29-b"
    assert distinct_command(a, [b]) == "python … --out=/scratch/u/runs/2026-11-29-a"
    long = a.replace("runs/", "runs/" + "x" * 40 + "/")
    assert distinct_command(long, [b]).endswith("/2026-11-29-a")
    assert distinct_command(a, []) == a  # alone, or nothing differs: as it is
    assert distinct_command(a, [a]) == a
    jobs = group_jobs({"n1": [_proc(1, rank=0, master_addr="h", master_port=1, cmdline=a),
                              _proc(2, rank=0, master_addr="h", master_port=2, cmdline=b)]})  # fmt: skip
    with pytest.raises(JobChoiceError) as err:
        choose_job(jobs)
    assert "2026-11-29-a" in str(err.value) and "2026-11-29-b" in str(err.value)


# --------------------------------------------------------------------------------------
# Two real jobs on this machine


# Slurm job ids of this run only: another run of these tests on the machine has its own.
FIRST_JOB_ID = str(100_000 + os.getpid() % 400_000 * 2)
SECOND_JOB_ID = str(int(FIRST_JOB_ID) + 1)


@pytest.fixture(scope="module")
def two_jobs() -> Iterator[tuple[ScenarioJob, ScenarioJob]]:
    """Two 2-rank gloo jobs, each in its own Slurm-like environment (SLURM_JOB_ID)."""
    env = dict(os.environ)
    first = start_scenario("same_collective", nproc=2, env={**env, "SLURM_JOB_ID": FIRST_JOB_ID})
    second = start_scenario("cleanup_deadlock", nproc=2, env={**env, "SLURM_JOB_ID": SECOND_JOB_ID})
    try:
        first.wait_ready(180)
        second.wait_ready(180)
        yield first, second
    finally:
        first.stop()
        second.stop()


def _port(job: ScenarioJob) -> str:
    raw = Path(f"/proc/{job.rank_pids()[0]}/environ").read_bytes()
    env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
    return env[b"MASTER_PORT"].decode()


def _either(*jobs: ScenarioJob) -> str:
    """A --match regex for these jobs' ranks only (other jobs may run on this machine)."""
    return "|".join(re.escape(str(j.state_dir)) for j in jobs)


def _dumped_pids(raw: dict) -> set[int]:
    return {d["pid"] for n in raw["nodes"] for s in n["samples"] for d in s}


@pytest.mark.slow
def test_cli_without_job_lists_the_jobs_and_dumps_nothing(
    two_jobs: tuple[ScenarioJob, ScenarioJob],
) -> None:
    first, second = two_jobs
    result = run_cli("stacks", "--json")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: ") and "pick one with --job" in lines[0]
    listed = "\n".join(lines[1:])
    assert f"127.0.0.1:{_port(first)}" in listed and f"127.0.0.1:{_port(second)}" in listed
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_job_captures_only_that_job(two_jobs: tuple[ScenarioJob, ScenarioJob]) -> None:
    first, second = two_jobs
    result = run_cli("stacks", "--json", "--job", f"127.0.0.1:{_port(second)}")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {r["pid"] for r in doc["ranks"]} == set(second.rank_pids())
    assert not {r["pid"] for r in doc["ranks"]} & set(first.rank_pids())
    assert doc["diagnosis"]["pattern"] == "cleanup_deadlock"
    assert doc["job"].endswith(f"127.0.0.1:{_port(second)}")

    both = run_cli("stacks", "--json", "--all-jobs", "--match", _either(first, second))
    assert both.returncode == 0, both.stderr
    pids = {r["pid"] for r in json.loads(both.stdout)["ranks"]}
    assert set(first.rank_pids()) | set(second.rank_pids()) <= pids

    clash = run_cli("stacks", "--job", "x", "--all-jobs")
    assert clash.returncode == 2 and "not allowed with" in clash.stderr


@pytest.mark.slow
def test_slurm_job_scope_dumps_only_that_jobs_processes(
    two_jobs: tuple[ScenarioJob, ScenarioJob],
) -> None:
    """`--slurm-job J` is the job J, not every job on J's nodes: filtered by each
    process's own SLURM_JOB_ID (read by the agent from /proc/PID/environ)."""
    first, second = two_jobs
    fleet = Fleet([NodeSpec(name="node0")], probe_gpus=False)
    try:
        raw = capture_raw(fleet, CaptureOptions(slurm_job=FIRST_JOB_ID))
        with pytest.raises(JobChoiceError):
            capture_raw(fleet, CaptureOptions(match=_either(first, second)))
    finally:
        fleet.close()
    assert _dumped_pids(raw) == set(first.rank_pids())
    assert raw["job"].endswith(f"127.0.0.1:{_port(first)}")


@pytest.mark.slow
async def test_tui_asks_which_job_and_captures_only_that_one(
    two_jobs: tuple[ScenarioJob, ScenarioJob],
) -> None:
    """`s` with two jobs on the node: a dialog asks; the chosen job alone is dumped, and
    the capture starts from the monitor's sample, reporting its progress."""
    from areal_console.app import ConsoleApp
    from areal_console.core.targets.resolve import local_node
    from areal_console.dialogs.job_choice import JobChoiceDialog
    from areal_console.screens.stacks import StacksScreen
    from textual.widgets import OptionList

    first, second = two_jobs
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(160, 40)) as pilot:
        pids = set(first.rank_pids()) | set(second.rank_pids())

        def sampled() -> set[int]:
            return {p.pid for v in app.monitor.snapshot() for p in v.processes}

        await _until(pilot, lambda: pids <= sampled(), "the monitor to see both jobs")
        await pilot.press("s")
        await _until(pilot, lambda: isinstance(app.screen, JobChoiceDialog), "the job dialog")
        options = app.screen.query_one(OptionList)
        wanted = f"127.0.0.1:{_port(second)}"
        keys = [options.get_option_at_index(i).id or "" for i in range(options.option_count)]
        assert any(wanted in k for k in keys) and any(
            f"127.0.0.1:{_port(first)}" in k for k in keys
        )
        options.highlighted = next(i for i, k in enumerate(keys) if k.endswith(wanted))
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, StacksScreen), "the Stacks screen")
        stacks = app.screen
        assert isinstance(stacks, StacksScreen)
        await _until(pilot, lambda: stacks.diagnosis is not None, "a diagnosis", timeout=90)
        assert stacks.capture is not None
        assert {r.pid for r in stacks.capture.ranks} == set(second.rank_pids())
        assert stacks.capture.job and stacks.capture.job.endswith(wanted)
        assert stacks.diagnosis is not None and stacks.diagnosis.pattern == "cleanup_deadlock"
        # the agent reported each dump as it finished: the screen was told rank by rank
        assert [(d, t) for d, t, _ in app._dumped.values()] == [(2, 2)]


async def _until(
    pilot: object, condition: Callable[[], object], what: str, timeout: float = 60
) -> None:
    await waits.until(pilot, condition, timeout, what)


@pytest.mark.slow
def test_cli_match_on_the_launchers_line_picks_that_job(gloo_job: GlooJob, tmp_path: Path) -> None:
    """Two real torchrun jobs of one script on this node: `--match` on what only the
    second job's launcher carries (its port) captures that job's ranks, and nothing of the
    other; a pattern both match asks, naming the pattern, in one line and a list."""
    port = free_port()
    second = GlooJob(2, tmp_path / "second", port=port)
    try:
        ranks = set(second.rank_pids().values())
        result = run_cli("stacks", "--json", "--match", f"--master-port {port} ")
        either = f"{re.escape(str(gloo_job.workdir))}|{re.escape(str(second.workdir))}"
        both = run_cli("stacks", "--match", either)
        report = run_cli("report", "--match", either, "-o", str(tmp_path / "r.md"))
    finally:
        second.stop()
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {r["pid"] for r in doc["ranks"] if r["rank"] is not None} == ranks
    assert doc["job"].endswith(f":{port}")
    assert both.returncode == 2, both.stderr
    lines = both.stderr.splitlines()
    assert (
        lines[0].startswith("error: --match ") and "matches 2 jobs; pick one with --job" in lines[0]
    )
    assert len(lines) == 3 and all(line.startswith("  ") for line in lines[1:]), lines
    assert "\\x0a" not in both.stderr
    # `report` asks the same way (its listing was one line with escaped newlines).
    assert report.returncode == 2 and report.stderr.splitlines() == lines, report.stderr
