"""Remote text on every screen that shows it, fed hostile through the real sources: a run's
log (metric names: the metric table, the plot's legend, the health banner), a rank's
Flight Recorder trace (group and op names: the ledger pane) and a job's log (the Jobs
screen's log pane). What reaches the terminal (the exported screen) carries no control
character; the text shows escaped. Command lines and frame names, through a real hung
process, are walked in test_hostile_inputs.py (test_cluster_and_stacks_screens_escape_...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.metrics.locate import HealthTarget
from areal_console.core.replay import runs as jobs
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.targets.resolve import local_node
from areal_console.screens.health import HealthScreen
from areal_console.screens.runs import RunsScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.ledger_pane import LedgerPane
from areal_console.widgets.metric_table import MetricTable
from textual.app import App
from textual.widgets import Log

from tests.support.areal_logfmt import actor_stats, write_run
from tests.support.recorded import SIZE, recorded_monitor
from tests.support.screens import ScreenHost
from tests.support.waits import until

# A retitle (OSC 2), a screen clear (CSI 2J), an 8-bit CSI, a bell, and markup.
HOSTILE = "evil\x1b]2;pwned\x07\x1b[2J\x9b31m[red]mk[/red]"
SHOWN = "evil\\x1b]2;pwned\\x07\\x1b[2J\\x9b31m[red]mk[/red]"
RAW_BYTES = ("\x1b", "\x07", "\x9b")


def terminal(app: App[None]) -> str:
    """What the app draws, as the terminal would get it (the exported screen)."""
    return app.export_screenshot().replace("&#x27;", "'").replace("&#160;", " ")


def assert_escaped(app: App[None]) -> None:
    screen = terminal(app)
    assert not [b for b in RAW_BYTES if b in screen], "raw control bytes reach the terminal"
    assert "pwned" in screen


async def test_metric_names_from_a_log_are_escaped(tmp_path: Path) -> None:
    def stats(step: int) -> dict[str, float]:
        return {HOSTILE: 1.0 + step, **actor_stats(step)}

    write_run(tmp_path, 5, stats=stats, finished=True)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        table = screen.query_one(MetricTable)
        await until(pilot, lambda: HOSTILE in [k.value for k in table.rows], what="the row")
        await pilot.press("slash", *"evil", "enter")
        await until(pilot, lambda: table.row_count == 1, what="the filtered table")
        await pilot.press("space")  # plot it: its name goes to the legend
        await until(pilot, lambda: HOSTILE in screen.plotted, what="the plot")
        await pilot.pause()
        assert_escaped(app)
        assert "evil\\x1b]2;pwned" in terminal(app)


async def test_group_and_op_names_from_a_trace_are_escaped() -> None:
    raw = json.loads((Path(__file__).parents[1] / "data/pyspy/ledger_op.json").read_text())
    for reply in raw["nodes"][0]["fr"]["live"]:
        trace = reply["trace"]
        group = trace["groups"][0]
        group["name"] = HOSTILE
        group["table"][0][0] = "gloo:" + HOSTILE
        trace["pg_config"] = {HOSTILE: trace["pg_config"]["0"]}
        trace["pg_status"] = {"0": trace["pg_status"]["0"]}
    raw["nodes"][0]["fr"]["live"][1]["trace"]["groups"][0]["table"][0][0] = "gloo:barrier"
    capture = build_capture(raw)
    assert capture.ledger is not None and capture.ledger.groups
    app = ScreenHost(StacksScreen(capture))
    async with app.run_test(size=(160, 48)) as pilot:
        pane = app.screen.query_one(LedgerPane)
        await until(pilot, lambda: getattr(pane, "ledger", None) is not None, what="the ledger")
        await pilot.pause()
        assert_escaped(app)
        assert "group evil\\x1b]2;pwned" in terminal(app)


async def test_a_servers_version_in_the_diagnosis_banner_is_escaped(tmp_path: Path) -> None:
    """A server process (any user's, listening on its own port) answers a weight version
    with escapes; the Stacks screen's banner quotes it (`weight_update_stuck`)."""
    from tests.unit.test_rollout_diagnosis import UPDATE_STACK, capture, rank, server
    from tests.unit.test_server_poll import Standin, poll

    standin = Standin(tmp_path / "s", "--kind", "sglang", "--mode", "odd_versions")
    try:
        polled = poll(standin, "sglang")
    finally:
        standin.stop()
    assert "\x1b" in polled["weight_version"]
    ranks = [rank(r, UPDATE_STACK) for r in range(4)] + [server(True, polled["weight_version"])]
    app = ScreenHost(StacksScreen(capture(ranks)))
    async with app.run_test(size=(200, 48)) as pilot:
        screen = app.screen
        await until(pilot, lambda: getattr(screen, "analysis", None) is not None, what="analysis")
        await pilot.press("f")  # every piece of evidence: the server's is the fifth
        await pilot.pause()
        assert_escaped(app)
        assert "version \u00b2\\x1b]2;pwned\\x07" in terminal(app)


@pytest.fixture()
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    f = Fleet([local_node()])
    yield f
    f.close()


async def test_a_jobs_log_is_escaped(fleet: Fleet) -> None:
    session = fleet.sessions[0]
    coloured = "\x1b[92m\x1b[1;38;2;180;140;80m(AReaL)\x1b[0m step 1 done"  # AReaL's log lines
    script = (
        f"import sys\nsys.stdout.write({HOSTILE!r} + '\\n' + {coloured!r} + '\\n')\n"
        "sys.stdout.flush()\n"
    )
    status = session.call("job_launch", {"job": "hostile", "argv": [sys.executable, "-c", script]})
    assert status["state"] == "running"
    record = jobs.RunRecord(job_id="hostile", node=session.name, plan={}, launched_at=time.time())
    jobs.save_run(record)
    app = ScreenHost(RunsScreen(fleet, poll=0.2))
    async with app.run_test(size=(140, 40)) as pilot:
        log = app.screen.query_one("#jobs-log", Log)
        await until(pilot, lambda: any("step 1" in line for line in log.lines), what="the log")
        # A log's colour and cursor codes (CSI) are dropped, every other control escaped.
        assert SHOWN.replace("\\x1b[2J", "") in log.lines
        assert "(AReaL) step 1 done" in log.lines
        await pilot.pause()
        assert_escaped(app)


async def test_slurm_job_names_of_other_users_are_escaped() -> None:
    from areal_console.core.slurm.client import parse_squeue_lines
    from areal_console.screens.slurm_jobs import SlurmJobsScreen

    line = f"7|{HOSTILE}|mallory|RUNNING|None|1|node1|gres:gpu:1"  # squeue's format, as read

    def list_jobs(all_users: bool) -> list[Any]:
        return parse_squeue_lines(line + "\n")

    screen = SlurmJobsScreen(list_jobs)
    app = ScreenHost(screen)
    async with app.run_test(size=(140, 30)) as pilot:
        await until(pilot, lambda: screen.loaded, what="Slurm's answer")
        await pilot.pause()
        assert_escaped(app)


async def test_a_process_detail_is_escaped(tmp_path: Path) -> None:
    """A real process with a hostile command line and rank variable, opened in full."""
    from areal_console.core.connection.records import ProcessRow
    from areal_console.dialogs.process_detail import ProcessDetailScreen

    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR=HOSTILE)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", HOSTILE], env=env
    )
    fleet = Fleet([local_node()])
    try:
        sample = fleet.sessions[0].call("sample", {"all": True})
        raw = next(p for p in sample["processes"] if p["pid"] == proc.pid)
        row = ProcessRow.from_agent(raw)
        assert row is not None and HOSTILE in row.cmdline
        app = ScreenHost(ProcessDetailScreen(None, fleet.sessions[0].name, row))
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            assert_escaped(app)
    finally:
        proc.kill()
        proc.wait()
        fleet.close()


async def test_a_source_file_shown_beside_a_frame_is_escaped(tmp_path: Path) -> None:
    from areal_console.core.stacks.records import Frame
    from areal_console.dialogs.source_view import SourceViewScreen

    source = tmp_path / "train.py"
    source.write_text(f"def step():\n    x = 1  # {HOSTILE}\n    return x\n")
    screen = SourceViewScreen(Frame(f"step{HOSTILE}", str(source), 2))
    app = ScreenHost(screen)
    async with app.run_test(size=(140, 30)) as pilot:
        body = screen.query_one("#source-body")
        await until(pilot, lambda: "reading" not in str(body.render()), what="the snippet")
        await pilot.pause()
        assert_escaped(app)


async def test_a_rollout_completion_is_escaped(tmp_path: Path) -> None:
    """A model's completion, as AReaL's rollout.dump_to_file wrote it, can hold anything."""
    from areal_console.screens.batches import BatchesScreen
    from areal_console.widgets.token_view import TokenView
    from textual.widgets import DataTable

    root = tmp_path / "rollout" / "3"
    root.mkdir(parents=True)
    record = {"task_id": "t1", "sample_idx": 0, "seqlen": 20, "prompt_len": 8,
              "head_version": 3, "tail_version": 3, "reward": 1.0,
              "prompt": f"q {HOSTILE}\nline two", "completion": f"a {HOSTILE}"}  # fmt: skip
    (root / "t1.jsonl").write_text(json.dumps(record) + "\n")
    screen = BatchesScreen(str(tmp_path / "rollout"))
    app = ScreenHost(screen)
    async with app.run_test(size=(140, 40)) as pilot:
        samples = screen.query_one("#samples", DataTable)
        await until(pilot, lambda: samples.row_count == 1, what="the sample")
        samples.focus()
        await pilot.press("enter")
        view = screen.query_one("#sample-view", TokenView)
        await until(pilot, lambda: view.view is not None, what="the sample view")
        await pilot.pause()
        assert_escaped(app)
        assert "line two" in str(view.render())  # a completion's own lines are kept
