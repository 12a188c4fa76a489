"""Remote text on every screen that shows it, fed hostile through the real sources: a run's
log (metric names: the metric table, the plot's legend, the health banner), a rank's
Flight Recorder trace (group and op names: the ledger pane) and a job's log (the Jobs
screen's log pane). What reaches the terminal (the exported screen) carries no control
character; the text shows escaped. Command lines and frame names, through a real hung
process, are walked in test_hostile_inputs.py (test_cluster_and_stacks_screens_escape_...)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.app import ConsoleApp
from areal_console.core import jobs
from areal_console.core.fleet import Fleet
from areal_console.core.metrics.locate import HealthTarget
from areal_console.core.stacks.model import build_capture
from areal_console.core.targets import local_node
from areal_console.screens.health import HealthScreen
from areal_console.screens.jobs import JobsScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.styles import STYLESHEET
from areal_console.widgets.ledger_pane import LedgerPane
from areal_console.widgets.metric_table import MetricTable
from recorded import SIZE, recorded_monitor
from textual.app import App
from textual.widgets import Log

from tests.areal_logfmt import actor_stats, write_run
from tests.waits import until

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


class Host(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self, screen: object) -> None:
        super().__init__()
        self._first = screen

    def on_mount(self) -> None:
        self.push_screen(self._first)  # type: ignore[arg-type]


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
    raw = json.loads((Path(__file__).parent / "data/pyspy/ledger_op.json").read_text())
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
    app = Host(StacksScreen(capture))
    async with app.run_test(size=(160, 48)) as pilot:
        pane = app.screen.query_one(LedgerPane)
        await until(pilot, lambda: getattr(pane, "ledger", None) is not None, what="the ledger")
        await pilot.pause()
        assert_escaped(app)
        assert "group evil\\x1b]2;pwned" in terminal(app)


@pytest.fixture()
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    f = Fleet([local_node()])
    yield f
    f.close()


async def test_a_jobs_log_is_escaped(fleet: Fleet) -> None:
    session = fleet.sessions[0]
    script = f"import sys\nsys.stdout.write({HOSTILE!r} + '\\n')\nsys.stdout.flush()\n"
    status = session.call("job_launch", {"job": "hostile", "argv": [sys.executable, "-c", script]})
    assert status["state"] == "running"
    record = jobs.JobRecord(job_id="hostile", node=session.name, plan={}, launched_at=time.time())
    jobs.save_job(record)
    app = Host(JobsScreen(fleet, poll=0.2))
    async with app.run_test(size=(140, 40)) as pilot:
        log = app.screen.query_one("#jobs-log", Log)
        await until(pilot, lambda: any("pwned" in line for line in log.lines), what="the log")
        assert SHOWN in log.lines
        await pilot.pause()
        assert_escaped(app)
