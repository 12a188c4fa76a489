"""`areal-console stacks` against real hung gloo jobs on this machine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.connection.fleet import Fleet
from areal_console.core.stacks.capture import CaptureOptions, capture_raw, take_capture
from areal_console.core.stacks.store import list_captures, load_capture
from areal_console.core.targets.resolve import NodeSpec
from conftest import run_cli

from tests.support.fixtures.hang import PATTERNS, ScenarioJob, start_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, ScenarioJob]]:
    """Every scenario running at once (their startups overlap); all killed at the end."""
    started: dict[str, ScenarioJob] = {}
    try:
        for pattern in PATTERNS:
            started[pattern] = start_scenario(pattern, nproc=4)
        for job in started.values():
            job.wait_ready(180)
        yield started
    finally:
        for job in started.values():
            job.stop()


def _master_port(job: ScenarioJob) -> str:
    """MASTER_PORT from a rank's environment (the scenario picks a free port)."""
    raw = Path(f"/proc/{job.rank_pids()[0]}/environ").read_bytes()
    env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
    return env[b"MASTER_PORT"].decode()


EXPECTED = {
    "cleanup_deadlock": ("cleanup_deadlock", ["0-2", "3"]),
    "collective_mismatch": ("collective_mismatch", ["0,2", "1,3"]),
    "same_collective": ("same_collective", ["0-3"]),
    "missing_rank": ("missing_ranks", ["0-2"]),
}


@pytest.mark.parametrize("pattern", sorted(EXPECTED))
def test_stacks_json_diagnoses_each_hang(jobs: dict[str, ScenarioJob], pattern: str) -> None:
    job = jobs[pattern]
    result = run_cli("stacks", "--match", str(job.state_dir), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    want_pattern, want_groups = EXPECTED[pattern]
    assert doc["diagnosis"]["pattern"] == want_pattern
    assert sorted(g["label"] for g in doc["groups"]) == want_groups
    assert doc["errors"] == []
    ranks = [r for r in doc["ranks"] if r["rank"] is not None]
    assert all(r["state"] == "ok" and r["world_size"] == 4 for r in ranks)
    assert all(r["threads"][0]["name"] == "MainThread" for r in ranks)
    # the ranks only: their launcher is never dumped; the capture names its job
    assert [r for r in doc["ranks"] if r["rank"] is None] == []
    assert doc["job"].endswith(":" + _master_port(job))
    # saved before it was printed, under the data dir, with the same content
    saved = load_capture(doc["id"])
    assert [r.rank for r in saved.rank_stacks] == [r["rank"] for r in ranks]


def test_slow_job_is_progressing_with_samples(jobs: dict[str, ScenarioJob]) -> None:
    job = jobs["slow"]
    result = run_cli(
        "stacks", "--match", str(job.state_dir), "--json", "--samples", "5", "--interval", "0.5"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["samples"] == 5
    assert doc["diagnosis"]["pattern"] == "progressing"
    assert any(r["progressing"] for r in doc["ranks"] if r["rank"] is not None)


def test_hung_job_sampled_twice_is_not_progressing(jobs: dict[str, ScenarioJob]) -> None:
    result = run_cli(
        "stacks",
        "--match",
        str(jobs["same_collective"].state_dir),
        "--json",
        "--samples",
        "2",
        "--interval",
        "0.2",
    )
    doc = json.loads(result.stdout)
    assert [r["progressing"] for r in doc["ranks"] if r["rank"] is not None] == [False] * 4
    assert doc["diagnosis"]["pattern"] == "same_collective"


def test_text_report_save_list_open_compare(jobs: dict[str, ScenarioJob], tmp_path: Path) -> None:
    first = run_cli(
        "stacks", "--match", str(jobs["cleanup_deadlock"].state_dir), "--save", str(tmp_path)
    )
    assert first.returncode == 0, first.stderr
    assert "DIAGNOSIS [cleanup_deadlock]" in first.stdout
    assert "Group B: rank 3 (1)  (outlier)" in first.stdout
    capture_id = first.stdout.split()[2]
    assert (tmp_path / f"{capture_id}.txt").read_text() == first.stdout
    exported = json.loads((tmp_path / f"{capture_id}.json").read_text())
    assert exported["diagnosis"]["pattern"] == "cleanup_deadlock"

    second = run_cli("stacks", "--match", str(jobs["collective_mismatch"].state_dir))
    second_id = second.stdout.split()[2]
    listing = run_cli("stacks", "--list", "--json")
    ids = [c["id"] for c in json.loads(listing.stdout)["captures"]]
    assert capture_id in ids and second_id in ids

    reopened = run_cli("stacks", "--open", capture_id)
    assert reopened.returncode == 0
    assert reopened.stdout == first.stdout
    latest = run_cli("stacks", "--open", "latest", "--json")
    assert json.loads(latest.stdout)["id"] == second_id

    compared = run_cli("stacks", "--compare", capture_id, second_id)
    assert compared.returncode == 0, compared.stderr
    # cleanup deadlock -> mismatch: ranks 0,2 wait in all_reduce_grads in both captures
    assert "changed: ranks 1,3" in compared.stdout
    assert "same: ranks 0,2" in compared.stdout
    assert "rank 3: Trainer.train:" in compared.stdout  # the finally vs. the loop body

    missing = run_cli("stacks", "--open", "no-such-capture")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: no saved capture")


def test_unsavable_capture_is_still_shown(jobs: dict[str, ScenarioJob], tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = run_cli(
        "stacks",
        "--match",
        str(jobs["same_collective"].state_dir),
        AREAL_CONSOLE_DATA_DIR=str(blocker),
    )
    assert result.returncode == 0
    assert "DIAGNOSIS [same_collective]" in result.stdout
    assert result.stderr.startswith("warning: capture not saved:")


def test_bad_regex_is_a_clear_error() -> None:
    result = run_cli("stacks", "--match", "(")
    assert result.returncode == 2
    assert result.stderr.startswith("error: bad --match regex")


def test_non_python_rank_is_an_error_row() -> None:
    """A process with rank variables that py-spy cannot read is data, not a failure."""
    env = dict(os.environ, RANK="7", WORLD_SIZE="8", LOCAL_RANK="7")
    proc = subprocess.Popen(["sleep", "4242.5"], env=env)
    try:
        fleet = Fleet([NodeSpec(name="node0")])
        try:
            capture = take_capture(fleet, CaptureOptions(match=r"sleep 4242\.5"), save=False)
        finally:
            fleet.close()
    finally:
        proc.kill()
        proc.wait()
    [rank] = capture.rank_stacks
    assert (rank.rank, rank.state) == (7, "error")
    assert rank.error and "not a Python process" in rank.error


def test_unreachable_node_is_partial(
    jobs: dict[str, ScenarioJob],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from areal_console.commands import stacks as command

    specs = [NodeSpec(name="node0"), NodeSpec(name="broken", transport="carrier-pigeon")]
    monkeypatch.setattr(command, "resolve_targets", lambda args: specs)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    command.register(sub)
    args = parser.parse_args(["stacks", "--match", str(jobs["same_collective"].state_dir)])
    assert command.run(args) == 3
    out, err = capsys.readouterr()
    assert "DIAGNOSIS [same_collective]" in out
    assert "node broken: unknown transport" in out
    assert "warning: broken:" in err


def test_capture_dumps_every_rank_and_is_saved(jobs: dict[str, ScenarioJob]) -> None:
    # How much the parallel dumps save over AReaL's one-by-one loop is measured in
    # bench/bench_capture.py, not timed here.
    fleet = Fleet([NodeSpec(name="node0")])
    try:
        fleet.call_all("ping")
        raw = capture_raw(fleet, CaptureOptions(match=str(jobs["collective_mismatch"].state_dir)))
        capture = take_capture(
            fleet, CaptureOptions(match=str(jobs["collective_mismatch"].state_dir))
        )
    finally:
        fleet.close()
    dumps = raw["nodes"][0]["samples"][0]
    assert len(dumps) == 4 and all(d["ok"] for d in dumps)
    assert any(c.capture_id == capture.capture_id for c in list_captures())


async def test_screen_captures_a_live_job(jobs: dict[str, ScenarioJob]) -> None:
    """The Stacks screen taking a real capture through the local agent, end to end."""
    from areal_console.screens.stacks import StacksScreen
    from areal_console.styles import STYLESHEET
    from areal_console.widgets.rank_group_table import RankGroupTable
    from textual.app import App

    fleet = Fleet([NodeSpec(name="node0")])
    options = CaptureOptions(match=str(jobs["cleanup_deadlock"].state_dir))
    screen = StacksScreen(recapture=lambda: take_capture(fleet, options))

    class StacksApp(App[None]):
        CSS_PATH = STYLESHEET

        def on_mount(self) -> None:
            self.push_screen(screen)

    try:
        async with StacksApp().run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 60
            while screen.analysis is None and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert screen.diagnosis is not None
            assert screen.diagnosis.pattern == "cleanup_deadlock"
            assert [g.label for g in screen.query_one(RankGroupTable).groups] == ["0-2", "3"]
            assert screen.capture is not None and screen.capture.capture_id
            saved = [c.capture_id for c in list_captures()]
            assert screen.capture.capture_id in saved  # saved before it was shown
    finally:
        fleet.close()
