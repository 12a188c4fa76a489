"""The Slurm view driven with Pilot, on recorded `squeue` output (real-cluster use is in
test_slurm.py)."""

from __future__ import annotations

from pathlib import Path

from areal_console.core.common.errors import UserError
from areal_console.core.slurm.client import SlurmJob, parse_squeue_lines
from areal_console.screens.slurm_jobs import SlurmJobsScreen
from areal_console.styles import STYLESHEET
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable, Label

from tests.support.waits import until

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def recorded_jobs(all_users: bool) -> list[SlurmJob]:
    return parse_squeue_lines((DATA / "squeue.txt").read_text())


class SlurmApp(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self, list_jobs) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.list_jobs = list_jobs
        self.chosen: list[str | None] = []

    def on_mount(self) -> None:
        self.push_screen(SlurmJobsScreen(self.list_jobs), callback=self.chosen.append)


def rows(screen: SlurmJobsScreen) -> list[list[str]]:
    table = screen.query_one("#slurm-jobs", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_jobs_listed_filtered_and_opened() -> None:
    calls: list[bool] = []

    def list_jobs(all_users: bool) -> list[SlurmJob]:
        calls.append(all_users)
        return recorded_jobs(all_users)

    app = SlurmApp(list_jobs)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, SlurmJobsScreen)
        await pilot.wait_for_scheduled_animations()
        await until(pilot, lambda: screen.loaded, what="Slurm's answer")
        assert rows(screen) == [
            ["6", "pending job", "root", "PENDING", "(BeginTime)", "gpu:2"],
            ["5", "slurm_gloo.sh", "root", "RUNNING", "node[1-3]", "gpu:1"],
        ]
        status = str(screen.query_one("#slurm-status", Label).render())
        assert status == "2 of 2 jobs, 1 running · your jobs"
        # A pending job can't be opened: it has no nodes yet.
        await pilot.press("enter")
        assert app.chosen == [] and app.screen is screen
        await pilot.press("slash", *"gloo", "enter")
        assert rows(screen) == [["5", "slurm_gloo.sh", "root", "RUNNING", "node[1-3]", "gpu:1"]]
        assert "filter: 'gloo'" in str(screen.query_one("#slurm-status", Label).render())
        await pilot.press("u")
        await until(pilot, lambda: len(calls) >= 2, what="a second squeue")
        assert calls[:2] == [False, True]
        await pilot.press("enter")
        await pilot.pause()
        assert app.chosen == ["5"]


async def test_slurm_errors_are_shown_and_escape_leaves() -> None:
    def broken(all_users: bool) -> list[SlurmJob]:
        raise UserError("Slurm's `squeue` is not available on this machine")

    app = SlurmApp(broken)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, SlurmJobsScreen)
        await until(pilot, lambda: screen.loaded, what="Slurm's answer")
        status = str(screen.query_one("#slurm-status", Label).render())
        assert "error: Slurm's `squeue` is not available on this machine" in status
        assert rows(screen) == []
        await pilot.press("escape")
        await pilot.pause()
        assert app.chosen == [None]


async def listed(pilot: Pilot[None]) -> None:
    """Until the screen shows Slurm's answer and no worker is still running."""

    def done() -> bool:
        return getattr(pilot.app.screen, "loaded", False) and not any(
            w.is_running for w in pilot.app.workers
        )

    await until(pilot, done, what="the job list")


def test_slurm_jobs_snapshot(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(SlurmApp(recorded_jobs), terminal_size=(100, 16), run_before=listed)
