"""The Health screen, driven by Pilot in the real app shell, on logs AReaL's code wrote."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.core.metrics.health import (
    BEHAVE_IMP_WEIGHT,
    GUIDE_METRICS,
    HealthThresholds,
)
from areal_console.core.metrics.locate import HealthTarget
from areal_console.screens.health import HealthScreen
from areal_console.widgets.health_banner import HealthBanner
from areal_console.widgets.metric_table import MetricTable

from tests.support import recorded
from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, write_run
from tests.support.recorded import SIZE, recorded_monitor, wait_until


def banner(app: ConsoleApp) -> str:
    found = list(app.screen.query(HealthBanner))  # none while the screen is mounting
    return str(found[0].render()) if found else ""


def drifting(step: int) -> dict[str, float]:
    return actor_stats(step, **{BEHAVE_IMP_WEIGHT: 1.0 + 0.01 * step})


async def test_metrics_table_search_plot_marks_and_warnings(tmp_path: Path) -> None:
    write_run(tmp_path, 30, stats=drifting, finished=True)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        table = screen.query_one(MetricTable)
        await wait_until(pilot, lambda: table.row_count == len(actor_stats(0)))
        names = [k.value for k in table.rows]
        assert names[:6] == [n for n in GUIDE_METRICS if n in names]  # the guide's first
        text = banner(app)
        assert "finished" in text and "behave_imp_weight/avg = 1.29" in text
        assert "rollout.max_head_offpolicyness" in text
        assert screen.plotted == [BEHAVE_IMP_WEIGHT]  # the warned metric is plotted

        await pilot.press("slash", *"behave_imp")
        await wait_until(pilot, lambda: table.row_count == 3)
        assert all("behave_imp" in str(k.value) for k in table.rows)
        await pilot.press("enter")  # search done: back to the table
        table.move_cursor(row=1)
        await pilot.press("space")
        assert len(screen.plotted) == 2
        await pilot.press("space")
        assert screen.plotted == [BEHAVE_IMP_WEIGHT]
        await pilot.press("enter")  # plot only the highlighted metric
        assert screen.plotted == [str(list(table.rows)[1].value)]
        await pilot.press("escape")
        await wait_until(pilot, lambda: table.row_count == len(actor_stats(0)))
        await pilot.press("escape")
        assert app.current_mode == "nodes"


async def test_live_run_updates_then_stalls_and_s_captures_that_job(tmp_path: Path) -> None:
    writer = AReaLLogWriter(tmp_path, mode="spmd")

    def commit(step: int, at: float) -> None:
        writer.now = at
        writer.commit(0, step, step, actor_stats(step))

    start = time.time() - 4.0
    for s in range(3):
        commit(s, start + 2.0 * s)  # a step every 2 s, the last one now
    screen = HealthScreen(
        HealthTarget(str(tmp_path / "trainer.log"), match="my-job"),
        thresholds=HealthThresholds(stall_factor=3, stall_min_seconds=1.0),
        poll_seconds=0.1,
    )
    app = ConsoleApp(None, recorded_monitor())
    captured: list[str | None] = []
    app.action_capture_stacks = lambda match=None: captured.append(match)  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(screen)
        table = screen.query_one(MetricTable)
        await wait_until(pilot, lambda: screen.report is not None and len(screen.report.steps) == 3)
        assert "running" in banner(app)
        commit(3, time.time())
        await wait_until(pilot, lambda: screen.report is not None and len(screen.report.steps) == 4)
        assert (
            str(table.get_cell(BEHAVE_IMP_WEIGHT, "latest"))
            == f"{actor_stats(3)[BEHAVE_IMP_WEIGHT]:.4g}"
        )
        await wait_until(pilot, lambda: "STALLED" in banner(app), timeout=30)
        assert "Press s to capture" in banner(app)
        await pilot.press("s")
        assert captured == ["my-job"]
        writer.close()  # the completion line: finished, not stalled
        await wait_until(pilot, lambda: "finished" in banner(app))
        assert "STALLED" not in banner(app)


async def _h_follows(processes: list[dict[str, object]], log: str) -> None:
    """`h` on a Cluster screen showing `processes` (alice's, on node0) opens Health on
    `log` and reads its four steps."""
    view = NodeView("node0", "node0", state="up", sample={"processes": processes, "gpus": []},
                    hello={"user": "alice"})  # fmt: skip
    app = ConsoleApp(None, RecordedMonitor([view]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        await wait_until(pilot, lambda: isinstance(app.screen, HealthScreen))
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        assert screen.target == HealthTarget(log, None, None)
        await wait_until(pilot, lambda: screen.report is not None)
        assert screen.report is not None and screen.report.steps == [0, 1, 2, 3]


async def test_h_on_cluster_finds_the_jobs_log_dir_from_its_processes(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs" / "alice" / "gsm8k" / "trial7"
    write_run(log_dir, 4, finished=True)
    worker = {"pid": 42, "ppid": 1, "rank": None, "role": "actor", "cmdline":
              f"python3 -m areal.infra.rpc.rpc_server --port 1 --experiment-name gsm8k "
              f"--trial-name trial7 --role actor --worker-index 0 --fileroot {tmp_path}"}  # fmt: skip
    await _h_follows([worker], str(log_dir))


async def test_h_on_cluster_finds_a_jobs_log_from_where_its_output_goes(tmp_path: Path) -> None:
    """`python train.py > run/trainer.log`: no log directory on the command line; the agent
    reports the ranks' stdout file (as the demo's), and `h` follows it."""
    write_run(tmp_path / "run", 4, mode="spmd", finished=True)
    log = tmp_path / "run" / "trainer.log"
    ranks = [{"pid": 50 + r, "ppid": 1, "rank": r, "world_size": 2, "role": "trainer",
              "user": "alice", "cmdline": "python -u train.py", "stdout": str(log)}
             for r in range(2)]  # fmt: skip
    await _h_follows(ranks, str(log))


async def test_a_log_last_written_long_ago_is_told_by_its_age(tmp_path: Path) -> None:
    """A log whose last step is years old (it read `no new step for 96000000s, ...x the
    median step time`): its age, and the question whether the job still runs."""
    write_run(tmp_path / "run", 4, finished=False)  # steps in November 2023
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path / "run")))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await wait_until(pilot, lambda: "STALLED" in banner(app))
        text = banner(app)
        assert "stalled: last step " in text and " d ago (median step time 30s)" in text, text
        assert "Check that the job still runs" in text and "Press s" not in text, text


async def test_health_command_and_a_missing_path(tmp_path: Path) -> None:
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")  # nothing to follow: says how to open one
        await pilot.pause()
        assert app.current_mode == "nodes"
        assert any(":health PATH" in str(n.message) for n in app._notifications)
        app.run_command(f"health {tmp_path / 'nope'}")
        await wait_until(pilot, lambda: "no data" in banner(app))
        assert "no such file or directory" in banner(app)


async def test_episodes_listed_newest_first_and_marked_on_the_plot(tmp_path: Path) -> None:
    """A drift from step 29 (active) and a spike at 49-51 that ended: both listed under
    the banner, newest first, and marked where they began (and ended) on the plot."""
    from areal_console.core.metrics.health import IMPORTANCE_WEIGHT
    from areal_console.widgets.metric_plot import MetricPlot

    def run(step: int) -> dict[str, float]:
        over = {BEHAVE_IMP_WEIGHT: 1.06 + 0.005 * (step - 29)} if step >= 29 else {}
        if 49 <= step <= 51:
            over[IMPORTANCE_WEIGHT] = 1.4
        return actor_stats(step, **over)

    write_run(tmp_path, 60, stats=run, finished=True)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await wait_until(pilot, lambda: "ended" in banner(app))
        text = banner(app)
        drift = text.index("⚠ since step 29: ppo_actor/update/behave_imp_weight/avg = 1.21")
        spike = text.index("✓ steps 49-51, ended: ppo_actor/update/importance_weight/avg = 1.4")
        assert drift < spike
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        assert screen.plotted == [BEHAVE_IMP_WEIGHT, IMPORTANCE_WEIGHT]
        plot = screen.query_one(MetricPlot)
        assert plot.marks == [(29, "red"), (49, "yellow"), (51, "green")]
        screen.plotted = [BEHAVE_IMP_WEIGHT]
        screen._replot()
        assert plot.marks == [(29, "red")]


@pytest.mark.slow
def test_health_screen_snapshot(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished run whose behave_imp_weight drifted and whose importance_weight spiked
    and recovered: both episodes listed and marked (relative path: deterministic)."""
    monkeypatch.chdir(tmp_path)
    assert snap_compare(recorded.health_app(), terminal_size=SIZE, run_before=recorded.open_health)


async def test_the_plot_legend_is_above_the_plot_not_in_it(tmp_path: Path) -> None:
    """plotext's legend sat inside the plot and the lines ran through its text."""
    write_run(tmp_path, 30, stats=drifting, finished=True)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        await wait_until(pilot, lambda: len(screen.plotted) >= 1)
        await recorded.until_drawn(pilot)
        plot = screen.query_one("#health-plot").region
        lines = [s.text for s in screen._compositor.render_strips()][plot.y : plot.bottom]
        named = [line for line in lines if "behave_imp_weight" in line]
        assert named and "behave_imp_weight/avg (cyan)" in named[0], lines
        for line in named:  # the name's line holds no part of a curve
            assert not any(0x2800 <= ord(c) <= 0x28FF for c in line), line
