"""Pilot tests of the replay dialog and the Runs screen against a real local agent."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.core.replay.plan import Verification, load_templates, local_trainer
from areal_console.core.targets.resolve import local_node
from areal_console.dialogs.confirm import ConfirmDialog
from areal_console.dialogs.replay import ReplayDialog
from areal_console.screens.runs import RunRow, RunsScreen
from textual.widgets import DataTable, Input, Label, Static

from tests.support.screens import ScreenHost, select_run
from tests.support.waits import until

SLOW_JOB = "import time\nprint('working', flush=True)\nfor i in range(600):\n time.sleep(0.1)\n"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("screens")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        mp.setenv("AREAL_CONSOLE_DATA_DIR", str(root / "data"))
        mp.setenv("AREAL_CONSOLE_CONFIG_DIR", str(root / "config"))
        yield root


@pytest.fixture(scope="module")
def dump(home: Path) -> Path:
    path = home / "dump"
    argv, env = local_trainer(
        "steps=2",
        "trajectory_debug.dump_rollout_data=true",
        f"trajectory_debug.path={path}",
        f"output_dir={home / 'run'}",
    )
    subprocess.run(
        argv,
        env=env,
        check=True,
        capture_output=True,
    )
    return path


@pytest.fixture()
def fleet(home: Path) -> Iterator[Fleet]:
    f = Fleet([local_node()])
    yield f
    for job in f.sessions[0].call("jobs")["jobs"]:
        if job["state"] == "running":
            f.sessions[0].call("job_stop", {"job": job["job"], "grace": 2}, timeout=20)
    f.close()


def text_of(screen: Any, selector: str) -> str:
    widget = screen.query_one(selector)
    return str(widget.render() if isinstance(widget, (Label, Static)) else widget.value)


@pytest.mark.slow
async def test_dialog_prefills_launches_and_jobs_screen_verifies(fleet: Fleet, dump: Path) -> None:
    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node))
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        assert dialog.query_one("#replay-gpus", Input).value == "cpu"  # no GPUs here
        assert dialog.focused is dialog.query_one("#replay-overrides", Input)
        assert dialog.query_one("#replay-steps", Input).value == "0:1"  # AReaL's global steps
        command = text_of(dialog, "#replay-command")
        assert "CUDA_VISIBLE_DEVICES=''" in command and "start_step=0 steps=2" in command
        await pilot.press("enter")
        await until(pilot, lambda: app.result != "pending")
    record = app.result
    assert isinstance(record, jobs.RunRecord) and record.node == node

    app2 = ScreenHost(lambda: RunsScreen(fleet, poll=0.2))
    async with app2.run_test(size=(120, 40)) as pilot:
        screen = app2.screen
        table = screen.query_one("#jobs-table", DataTable)
        key = f"{node}/{record.job_id}"
        await until(
            pilot,
            lambda: (
                key in table.rows
                and str(table.get_cell(key, "verification")) == "matches recording"
            ),
            timeout=60,
        )
        assert str(table.get_cell(key, "state")) == "finished"
        assert str(table.get_cell(key, "exit")) == "0"
        assert str(table.get_cell(key, "steps")) == "0-1"
        await pilot.press("enter")
        log = screen.query_one("#jobs-log")
        await until(pilot, lambda: any("(replayed)" in line for line in log.lines))
        assert "replay matches recording" in text_of(screen, "#jobs-detail")


async def test_dialog_opens_on_overrides_and_launches_what_was_typed(
    fleet: Fleet, dump: Path
) -> None:
    """The guide's recipe, literally: type `actor.eps_clip=0.1` in overrides, press enter."""
    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node))
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = app.screen
        overrides = dialog.query_one("#replay-overrides", Input)
        assert dialog.focused is overrides
        assert "tab: next field" in text_of(dialog, "#replay-hint")
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        # At 80x24 the fields are borderless; the focused one still looks unlike the others.
        gpus = dialog.query_one("#replay-gpus", Input)
        assert overrides.compact and gpus.compact
        assert overrides.styles.background != gpus.styles.background
        await pilot.press(*"actor.eps_clip=0.1", "enter")  # enter at once, no pause between
        await until(pilot, lambda: app.result != "pending")
    record = app.result
    assert isinstance(record, jobs.RunRecord), text_of(dialog, "#replay-error")
    assert "actor.eps_clip=0.1" in record.plan["argv"], record.plan["argv"]


async def test_typed_overrides_and_enter_in_one_burst_launch_with_the_overrides(
    fleet: Fleet, dump: Path
) -> None:
    """Keys as a terminal delivers a fast typist's (or a paste's) burst: all queued before
    the first is handled. enter launched the run without the overrides typed just before
    it (it read the field before the field had taken the keys)."""
    from textual import events

    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node))
    async with app.run_test(size=(160, 45)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        for char in "actor.eps_clip=0.1":
            app.post_message(events.Key(char, char))
        app.post_message(events.Key("enter", "\r"))
        await until(pilot, lambda: app.result != "pending")
    record = app.result
    assert isinstance(record, jobs.RunRecord), text_of(dialog, "#replay-error")
    assert "actor.eps_clip=0.1" in record.plan["argv"], record.plan["argv"]


async def test_dialog_shows_bad_input_and_read_only_blocks_launch(fleet: Fleet, dump: Path) -> None:
    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node, read_only=True))
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        dialog.query_one("#replay-gpus", Input).value = "5"
        await until(pilot, lambda: "has no GPUs" in text_of(dialog, "#replay-error"))
        dialog.query_one("#replay-gpus", Input).value = "cpu"
        dialog.query_one("#replay-steps", Input).value = "1:7"
        await until(pilot, lambda: "available steps: 0-1" in text_of(dialog, "#replay-error"))
        dialog.query_one("#replay-steps", Input).value = "0:1"
        await until(pilot, lambda: text_of(dialog, "#replay-error") == "")
        await pilot.press("enter")
        await until(pilot, lambda: "read-only" in text_of(dialog, "#replay-error"))
        assert app.result == "pending"
        await pilot.press("escape")
        await until(pilot, lambda: app.result is None)


async def test_dialog_offers_the_agents_python_and_refuses_one_without_torch(
    fleet: Fleet, dump: Path
) -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True,
                                      check=False).returncode == 0:  # fmt: skip
        pytest.skip("no system python3 without torch on this machine")
    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node))
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        # The local agent runs on this interpreter, which has torch: the default.
        assert dialog.query_one("#replay-python", Input).value == sys.executable
        assert text_of(dialog, "#replay-command").startswith(
            f"CUDA_VISIBLE_DEVICES='' {sys.executable} "
        )
        assert "the node agent's interpreter, which has torch" in text_of(dialog, "#replay-device")
        dialog.query_one("#replay-python", Input).value = bare
        await until(pilot, lambda: f" {bare} " in text_of(dialog, "#replay-command"))
        await pilot.press("enter")
        await until(pilot, lambda: "cannot import torch" in text_of(dialog, "#replay-error"), 60)
        assert f"{bare} cannot import torch (ModuleNotFoundError" in text_of(
            dialog, "#replay-error"
        )
        assert app.result == "pending"  # nothing launched; the dialog stays
        await pilot.press("escape")
        await until(pilot, lambda: app.result is None)


async def test_dialog_at_80x24_shows_every_field_and_the_whole_command(
    fleet: Fleet, dump: Path
) -> None:
    node = fleet.sessions[0].name
    app = ScreenHost(lambda: ReplayDialog(fleet, str(dump), node))
    async with app.run_test(size=(80, 24)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        await pilot.pause()
        shown = "\n".join(strip.text for strip in dialog._compositor.render_strips())
        box = dialog.query_one("#replay-box").region
        assert box.right <= 80 and box.bottom <= 24
        for field in ("#replay-gpus", "#replay-steps", "#replay-overrides", "#replay-python"):
            assert dialog.query_one(field, Input).region.height >= 1
        preview = dialog.query_one("#replay-command").region
        lines = shown.splitlines()[preview.y : preview.bottom]
        on_screen = "".join(line[preview.x : preview.right] for line in lines)
        command = text_of(dialog, "#replay-command")  # wrapped on screen: compare unspaced
        assert "".join(on_screen.split()) == "".join(command.split())
        assert "enter: launch" in shown
        await pilot.press("escape")
        await until(pilot, lambda: app.result is None)


async def test_template_without_steps_replays_from_step_zero(fleet: Fleet, dump: Path) -> None:
    """AReaL's replay has no start step: the field is disabled and the run is bounded by
    total_train_steps after the dumped steps (0 and 1 here)."""
    node = fleet.sessions[0].name
    templates = load_templates({"like-areal": "python3 -c pass trajectory_debug.path={dir}"})
    app = ScreenHost(
        lambda: ReplayDialog(
            fleet, str(dump), node, template="like-areal", templates=templates, read_only=True
        )
    )
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = app.screen
        await until(pilot, lambda: "total_train_steps" in text_of(dialog, "#replay-command"))
        steps = dialog.query_one("#replay-steps", Input)
        assert steps.disabled and steps.value == "" and "step 0" in steps.placeholder
        assert text_of(dialog, "#replay-command").endswith("total_train_steps=2")
        await pilot.press("escape")
        await until(pilot, lambda: app.result is None)


async def test_stop_asks_first_and_read_only_cannot_stop(fleet: Fleet) -> None:
    session = fleet.sessions[0]
    node = session.name
    for name in ("slow-a", "slow-b"):
        status = session.call("job_launch", {"job": name, "argv": [sys.executable, "-c", SLOW_JOB]})
        assert status["state"] == "running"
        jobs.save_run(jobs.RunRecord(job_id=name, node=node, plan={}, launched_at=time.time()))
    key_a, key_b = f"{node}/slow-a", f"{node}/slow-b"

    ro = ScreenHost(lambda: RunsScreen(fleet, read_only=True, poll=0.2))
    async with ro.run_test(size=(120, 40)) as pilot:
        table = ro.screen.query_one("#jobs-table", DataTable)
        await until(pilot, lambda: key_a in table.rows)
        await pilot.press("s")
        await until(pilot, lambda: "read-only" in text_of(ro.screen, "#jobs-status"))
        assert not isinstance(ro.screen, ConfirmDialog)

    app = ScreenHost(lambda: RunsScreen(fleet, poll=0.2))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        table = screen.query_one("#jobs-table", DataTable)

        def state(key: str) -> str:
            return str(table.get_cell(key, "state")) if key in table.rows else ""

        await until(pilot, lambda: state(key_a) == state(key_b) == "running")
        # One job: a single confirmation, "n" leaves it running.
        await select_run(pilot, key_a)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.press("n")
        await until(pilot, lambda: app.screen is screen)
        assert state(key_a) == "running"
        # Two marked jobs: one confirmation stops both.
        await pilot.press("space")
        await select_run(pilot, key_b)
        await pilot.press("space")
        await until(pilot, lambda: str(table.get_cell(key_b, "job")).startswith("● "))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "Stop 2 jobs?" in text_of(app.screen, "#confirm-question")
        await pilot.press("y")
        await until(pilot, lambda: state(key_a) == state(key_b) == "stopped", timeout=30)
        assert str(table.get_cell(key_a, "exit")) == "-15"
        assert str(table.get_cell(key_a, "job")) == "slow-a"  # marks are cleared
        await pilot.press("slash")
        await pilot.press(*"no-such-job")
        await until(pilot, lambda: key_a not in table.rows)
        await pilot.press("escape")
        await until(pilot, lambda: key_a in table.rows)


def test_merge_marks_jobs_of_lost_nodes_unknown() -> None:
    known = [
        jobs.RunRecord("a", "n1", {}, 2.0, state="running", log="/x/a.log"),
        jobs.RunRecord("b", "n2", {}, 1.0, state="running"),
        jobs.RunRecord("c", "n3", {}, 0.5, state="finished", exit_code=0),
    ]
    merged = jobs.merge_runs(
        known,
        {
            "n1": "connection reset",
            "n3": [
                {"job": "c", "state": "finished", "exit_code": 0},
                {
                    "job": "d",
                    "state": "running",
                    "started": 9.0,
                    "meta": {"plan": {"steps": [1, 2]}},
                },
            ],
        },
    )
    states = {(r.job_id, r.state) for r in merged}
    assert states == {("a", "unknown"), ("b", "unknown"), ("c", "finished"), ("d", "running")}
    assert merged[0].job_id == "d" and merged[0].plan == {"steps": [1, 2]}
    assert next(r for r in merged if r.job_id == "a").log == "/x/a.log"  # the log path is kept


async def test_jobs_screen_shows_slurm_ids_and_state(fleet: Fleet, home: Path) -> None:
    record = jobs.RunRecord("slurm-a", "node2", {}, time.time() + 100, state="finished")
    record.exit_code, record.slurm_job, record.slurm_step = 0, "12", "12.3"
    record.extra["slurm_state"] = "COMPLETED"
    jobs.save_run(record)
    app = ScreenHost(lambda: RunsScreen(fleet, poll=0.2))
    async with app.run_test(size=(120, 40)) as pilot:
        table = await select_run(pilot, "node2/slurm-a")
        await until(
            pilot, lambda: "slurm step 12.3 COMPLETED" in text_of(app.screen, "#jobs-detail")
        )
        assert str(table.get_cell("node2/slurm-a", "state")) == "finished"  # not "unknown"


def test_slurm_fields_round_trip_and_old_records_load() -> None:
    old = {"job_id": "x", "node": "n", "plan": {}, "launched_at": 1.0, "state": "finished"}
    record = jobs.RunRecord.from_json(old)
    assert (record.slurm_job, record.slurm_step, record.slurm_label) == (None, None, "")
    record.slurm_job = "77"
    again = jobs.RunRecord.from_json(record.to_json())
    assert (again.slurm_job, again.slurm_step, again.slurm_label) == ("77", None, "slurm job 77")
    running = jobs.RunRecord("s", "gone", {}, 1.0, state="running", slurm_job="77")
    assert jobs.merge_runs([running], {})[0].state == "running"  # Slurm, not a node, holds it


def test_job_record_reads_odd_plans_and_saved_verifications() -> None:
    good = jobs.RunRecord("g", "n", {"steps": [3, 4], "gpus": [0, 1], "metrics": "m.jsonl",
                                     "argv": ["python3", "t.py"]}, 1.0)  # fmt: skip
    assert (good.steps, good.gpus, good.verifiable, good.argv) == ((3, 4), (0, 1), True, ())
    assert good.command == ("python3", "t.py")  # as planned, until the node says
    good.update_from_node({"state": "running", "argv": ["python3", "/j/t.py"]})
    assert good.command == good.argv == ("python3", "/j/t.py")
    odd = jobs.RunRecord("o", "n", {"steps": "3-4", "gpus": "0,1", "argv": "python3"}, 1.0)
    assert (odd.steps, odd.gpus, odd.verifiable, odd.command) == (None, (), False, ())
    assert RunRow(odd).cells()[4:] == ("", "", "—")
    # A saved verification keeps its wording; odd fields read as nothing found.
    saved = {"matched": False, "steps": [3, "x"], "tolerance": "1e-3", "summary": "as saved",
             "first_mismatch": {"step": 3, "metric": "actor_loss"}}  # fmt: skip
    record = jobs.RunRecord.from_json(
        {"job_id": "v", "node": "n", "plan": {}, "launched_at": 1.0, "verification": saved}
    )
    v = record.verification
    assert v is not None and (v.steps, v.tolerance, v.summary) == ([3], None, "as saved")
    assert v.verdict == "differs at step 3: actor_loss"
    assert jobs.RunRecord.from_json(record.to_json()).verification == v
    assert Verification.from_json("junk") is None
    bare = Verification.from_json({"comparable": False})
    assert bare is not None and bare.verdict == "cannot compare"
    assert bare.summary == "cannot compare with the recording: None"


@pytest.mark.slow
async def test_after_a_launch_the_jobs_screen_follows_the_new_job(fleet: Fleet, dump: Path) -> None:
    """`r` `enter` in the Batches screen: the Runs screen opens with the cursor, the detail
    and the log on the job just launched, listed first (newest first, as after a restart)."""
    from areal_console.app import ConsoleApp

    session = fleet.sessions[0]
    node = session.name
    older = f"{node}/older"
    session.call("job_launch", {"job": "older", "argv": [sys.executable, "-c", SLOW_JOB]})
    jobs.save_run(jobs.RunRecord(job_id="older", node=node, plan={}, launched_at=time.time()))
    before = {f"{r.node}/{r.job_id}" for r in jobs.load_runs()}
    app = ConsoleApp(fleet, batches_path=str(dump), refresh_interval=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        table = screen.query_one("#jobs-table", DataTable)
        await select_run(pilot, older)
        await pilot.press("3")
        await until(pilot, lambda: app.screen.query_one("#steps", DataTable).row_count > 0)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ReplayDialog))
        dialog = app.screen
        await until(pilot, lambda: "reference_trainer.py" in text_of(dialog, "#replay-command"))
        await pilot.press("enter")
        await until(pilot, lambda: app.screen is screen, timeout=60)
        launched = {f"{r.node}/{r.job_id}" for r in jobs.load_runs()} - before
        assert len(launched) == 1
        new = launched.pop()
        await until(pilot, lambda: screen.selected == new, timeout=30)
        order = [k.value for k in table.rows]
        assert order == list(screen.records)  # the table shows merge_runs' order
        assert order.index(new) < order.index(older)
        assert table.cursor_row == order.index(new)
        assert new.split("/", 1)[1] in text_of(screen, "#jobs-detail")
        await until(pilot, lambda: screen._log_key == new)


@pytest.mark.slow
async def test_a_finished_replay_whose_recording_is_gone_is_marked_without_a_toast(
    fleet: Fleet, dump: Path, home: Path
) -> None:
    copy = home / "gone-later"
    shutil.copytree(dump, copy)
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_console",
            "replay",
            str(copy),
            "--local",
            "--steps",
            "1:1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip  (no --wait: the run is saved unverified, as one launched from the TUI)
    assert launched.returncode == 0, launched.stderr
    job_id = json.loads(launched.stdout)["job_id"]
    session = fleet.sessions[0]
    deadline = time.monotonic() + 120
    while not any(j["job"] == job_id and j["state"] != "running"
                  for j in session.call("jobs")["jobs"]):  # fmt: skip
        assert time.monotonic() < deadline, "the replay never ended"
        time.sleep(0.2)
    shutil.rmtree(copy)  # the recording deleted after the run: it cannot be compared now
    app = ScreenHost(lambda: RunsScreen(fleet, poll=0.2))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one("#jobs-table", DataTable)
        key = f"{session.name}/{job_id}"
        await until(pilot, lambda: key in table.rows
                    and str(table.get_cell(key, "verification")) == "cannot compare", timeout=60)  # fmt: skip
        await pilot.pause()
        loud = [n.message for n in app._notifications if n.severity in ("warning", "error")]
        assert loud == []
