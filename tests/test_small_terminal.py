"""Every screen at 80x24, the smallest terminal people still use: SVG snapshots from the
recorded data the screenshots use, plus the things that must survive the squeeze (the
footer's `? Help`, the Batches stats beside the step list, the whole diagnosis one key
away)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import recorded
from areal_console.app import ConsoleApp
from areal_console.screens.batches import BatchesScreen
from areal_console.widgets.diagnosis_banner import DiagnosisBanner
from recorded import recorded_monitor
from test_slurm_screen import SlurmApp, listed, recorded_jobs
from textual.widgets import Static

from tests.waits import until

SMALL = (80, 24)


def footer_text(app: ConsoleApp) -> str:
    from textual.widgets._footer import FooterKey

    return " ".join(f"{k.key}" for k in app.screen.query(FooterKey))


def test_cluster_at_80x24(snap_compare: Any) -> None:
    assert snap_compare(ConsoleApp(None, recorded_monitor()), terminal_size=SMALL)


@pytest.mark.slow
def test_stacks_at_80x24(snap_compare: Any) -> None:
    assert snap_compare(recorded.stacks_app(), terminal_size=SMALL, run_before=recorded.open_stacks)


@pytest.mark.slow
def test_batches_at_80x24(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    recorded.write_batches_dump("dumps")
    assert snap_compare(
        recorded.batches_app(), terminal_size=SMALL, run_before=recorded.open_sample
    )


@pytest.mark.slow
def test_jobs_at_80x24(snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    assert snap_compare(recorded.jobs_app(), terminal_size=SMALL, run_before=recorded.open_jobs)


@pytest.mark.slow
def test_health_at_80x24(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert snap_compare(recorded.health_app(), terminal_size=SMALL, run_before=recorded.open_health)


def test_slurm_at_80x24(snap_compare: Any) -> None:
    assert snap_compare(SlurmApp(recorded_jobs), terminal_size=SMALL, run_before=listed)


async def test_what_must_survive_80x24(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    recorded.write_batches_dump("dumps")
    app = recorded.batches_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        keys = footer_text(app).split()
        assert keys[0] == "question_mark"  # `? Help` first: never the key that is cut
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BatchesScreen))
        screen = app.screen
        assert isinstance(screen, BatchesScreen)
        summary = screen.query_one("#summary", Static)
        await until(pilot, lambda: "seq_len" in str(summary.render()))
        width = summary.content_region.width
        lines = str(summary.render()).splitlines()
        grid = [line for line in lines if line.startswith(("seq_len", "reward "))]
        assert grid and all(len(line) <= width for line in grid), (width, grid)
        assert screen.query_one("#steps-pane").size.width <= 46
        # In the samples, the open sample gets the summary's rows; back on the steps, the
        # summary returns.
        await recorded.open_sample(pilot)
        assert not summary.parent.display  # type: ignore[union-attr]
        assert screen.query_one("#sample-pane").size.height >= 8
        screen.query_one("#steps").focus()
        await pilot.pause()
        assert summary.parent.display  # type: ignore[union-attr]

    stacks = recorded.stacks_app()
    async with stacks.run_test(size=SMALL) as pilot:
        await recorded.open_stacks(pilot)
        banner = stacks.screen.query_one(DiagnosisBanner)
        short = banner.size.height
        await pilot.press("f")
        await pilot.pause()
        assert banner.full and banner.size.height > short
        assert "Usually one rank raised" in str(banner.render())
        await pilot.press("f")
        await pilot.pause()
        assert not banner.full
