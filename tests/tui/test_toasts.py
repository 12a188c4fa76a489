"""Toasts carry remote text, and Textual reads a toast's message as markup unless told not
to: a dump's recorded metric `"x[/]"` ended the console with a MarkupError when the Runs
screen verified a replay, and `[@click=app.quit]` or `[link=...]` would have rendered live.
Each toast source reachable here is driven with hostile text; the console keeps running
and the text is shown as it was written (control characters as escapes). The contract
that every toast goes through the one escaping path is in tests/unit/test_screen_text_contract.py.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from areal_console.app import ConsoleApp
from areal_console.core.connection import ssh
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.core.slurm.client import parse_squeue_lines
from areal_console.core.targets.resolve import local_node
from areal_console.screens.runs import RunsScreen
from areal_console.screens.slurm_jobs import SlurmJobsScreen
from textual.widgets._toast import Toast

from tests.support.nobody import NOBODY_PYTHON, as_nobody, needs_nobody, shared_tmp
from tests.support.recorded import recorded_monitor
from tests.support.screens import ScreenHost, select_run, toasts
from tests.support.waits import until

# Closing markup, an action, a link, a retitle (OSC 2) and a colour (CSI).
HOSTILE = "x[/] [@click=app.quit]q[/] [link=http://x]l[/link] \x1b]2;pwned\x07\x1b[31m"
SHOWN = "x[/] [@click=app.quit]q[/] [link=http://x]l[/link] \\x1b]2;pwned\\x07\\x1b[31m"


async def verified_from_runs(record: jobs.RunRecord, says: str) -> str:
    """Save `record`, verify it from the Runs screen (`v`) with this machine as the fleet,
    and return the toasts' text, on one line, once one says `says`; the console must still
    be running then."""
    jobs.save_run(record)
    fleet = Fleet([local_node()])
    try:
        app = ScreenHost(RunsScreen(fleet, poll=0.2))
        async with app.run_test(size=(160, 40), notifications=True) as pilot:
            await select_run(pilot, f"{record.node}/{record.job_id}")
            await pilot.press("v")
            await until(pilot, lambda: any(says in t for t in toasts(app)))
            assert app.is_running
            return "".join(toasts(app)).replace("\n", "")
    finally:
        fleet.close()


@needs_nobody
async def test_a_recorded_metric_with_markup_is_a_literal_toast(tmp_path: Path) -> None:
    """The reported case: the dump's owner (`nobody`) recorded a metric value `x[/]`; the
    Runs screen (the console as root) verifies the replay against it."""
    node = local_node()
    with shared_tmp() as shared:
        recorded, replayed = shared / "recorded.jsonl", tmp_path / "replayed.jsonl"
        script = f"import json; open({str(recorded)!r}, 'w').write(json.dumps({{'step': 0, 'task_reward': {HOSTILE!r}}}))"
        as_nobody(NOBODY_PYTHON, "-c", script)
        replayed.write_text(json.dumps({"step": 0, "task_reward": 1.5}) + "\n")
        plan = {"steps": [0, 0], "metrics": str(replayed), "recorded_metrics": str(recorded)}
        record = jobs.RunRecord("verify-x", node.name, plan, time.time(), state="finished")
        shown = await verified_from_runs(record, "replay differs")
    assert SHOWN in shown.replace("'", ""), shown


async def test_a_failing_worker_with_a_hostile_node_name_is_a_literal_toast() -> None:
    """A worker's failure names the node and the error: a run record naming a node that
    is not in the fleet, called `[@click=app.quit]...`, fails its verification."""
    plan = {"steps": [0, 0], "metrics": "m", "recorded_metrics": "r"}
    record = jobs.RunRecord("gone", "n" + HOSTILE, plan, time.time(), state="finished")
    assert SHOWN in await verified_from_runs(record, "gone on n")


async def test_commands_and_known_hosts_notes_are_literal_toasts() -> None:
    """The console's own toasts that quote what they were given: an unknown `:` command or
    theme, and a known_hosts note (it quotes the file's line)."""
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        app.run_command(f"theme {HOSTILE}")
        app.run_command("[@click=app.quit]x[/]")
        ssh._note(f"known_hosts line 3: {HOSTILE}")
        app._show_known_hosts_notes()
        await pilot.pause()
        await until(pilot, lambda: len(toasts(app)) >= 3)
        shown = [t.replace("\n", "") for t in toasts(app)]
        assert sum(SHOWN in t for t in shown) == 2, shown
        assert any("Unknown command '[@click=app.quit]x[/]'" in t for t in shown), shown
        await pilot.click(Toast)  # a live `[@click=app.quit]` would end the app here
        await pilot.pause()
        assert app.is_running


async def test_a_slurm_job_state_with_markup_is_a_literal_toast() -> None:
    """The Slurm jobs screen's "nothing to inspect yet" toast quotes the job's state."""
    squeue = (Path(__file__).resolve().parents[1] / "data" / "slurm" / "squeue.txt").read_text()
    jobs = [
        dataclasses.replace(j, state=HOSTILE) if j.state != "RUNNING" else j
        for j in parse_squeue_lines(squeue)
    ]
    app = ScreenHost(SlurmJobsScreen(lambda all_users: jobs))
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        screen = app.screen
        await until(pilot, lambda: getattr(screen, "loaded", False))
        await pilot.press("enter")  # the first row: the job that is not running
        await until(pilot, lambda: any("nothing to inspect yet" in t for t in toasts(app)))
        assert any(SHOWN in t.replace("\n", "") for t in toasts(app)), toasts(app)
        assert app.is_running
