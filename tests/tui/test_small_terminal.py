"""Every screen at 80x24, the smallest terminal people still use, and at 160x45: SVG
snapshots from the recorded data the screenshots use (the GPU pane from a recorded H200
node), plus the things that must survive the squeeze, asserted as facts: the footer's
`? Help` and `q Quit`, metric rows on Health, whole function names in a Stacks diff, every
rank group, the GPU row's temperature and power, a readable COMMAND, a job's verdict uncut,
the Batches stats beside the step list, the whole diagnosis one key away."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.replay import runs as jobs
from areal_console.core.replay.plan import Verification
from areal_console.core.stacks.parsing import build_capture
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.diagnosis_banner import DiagnosisBanner
from textual.widgets import Static

from tests.support import recorded
from tests.support.recorded import recorded_monitor
from tests.support.waits import until
from tests.tui.test_slurm_screen import SlurmApp, listed, recorded_jobs

RECORDED_JOBS = recorded.recorded_jobs  # before a test puts other ids in its place

SMALL = (80, 24)
LARGE = (160, 45)


def footer_text(app: ConsoleApp) -> str:
    from textual.widgets._footer import FooterKey

    return " ".join(f"{k.key}" for k in app.screen.query(FooterKey))


SIZES = [SMALL, LARGE]
SIZE_IDS = ["80x24", "160x45"]


def screen_text(app: ConsoleApp) -> str:
    """What the terminal shows now, as text (the screen's composed lines)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_cluster_at(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(ConsoleApp(None, recorded_monitor()), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_gpu_node_at(snap_compare: Any, size: tuple[int, int]) -> None:
    """The recorded H200 node (real NVML values) in the Cluster screen's GPU pane."""
    assert snap_compare(recorded.h200_app(), terminal_size=size)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_stacks_at(snap_compare: Any, size: tuple[int, int]) -> None:
    app = recorded.stacks_app("ledger_op")  # groups and the collective ledger share a pane
    assert snap_compare(app, terminal_size=size, run_before=recorded.open_stacks)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_stacks_diff_at(snap_compare: Any, size: tuple[int, int]) -> None:
    async def diff(pilot: Any) -> None:
        await recorded.open_stacks(pilot, diff=True)

    assert snap_compare(recorded.stacks_app(), terminal_size=size, run_before=diff)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_batches_at(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    monkeypatch.chdir(tmp_path)
    recorded.write_batches_dump("dumps")
    assert snap_compare(recorded.batches_app(), terminal_size=size, run_before=recorded.open_sample)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_jobs_at(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    # Ids as `new_run_id` makes them: at 80 columns the job column is cut, keeping each
    # id's `-HHMMSS-hex` end after an ellipsis (every replay's id starts the same).
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(recorded, "recorded_jobs", long_named_jobs)
    assert snap_compare(recorded.jobs_app(), terminal_size=size, run_before=recorded.open_jobs)


# The demo's replay with its drift: the longest verdict the Runs screen shows.
DIFFERS = Verification(matched=False, steps=[11, 12], first_mismatch={
    "step": 12, "metric": "behave_imp_weight", "recorded": 1.00412, "replayed": 1.00398})  # fmt: skip


def long_named_jobs() -> list[jobs.RunRecord]:
    """The recorded jobs with ids as `new_run_id` makes them, alike but for their end; the
    verified one differs from its recording (a long verdict)."""
    named = []
    for i, r in enumerate(RECORDED_JOBS()):
        job_id = f"replay-20261126-0827{i}2-ab3ce{i}"
        named.append(dataclasses.replace(r, job_id=job_id, log=r.log.replace(r.job_id, job_id),
                                         verification=DIFFERS if i == 0 else r.verification))  # fmt: skip
    return named


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_health_at(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert snap_compare(recorded.health_app(), terminal_size=size, run_before=recorded.open_health)


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


@pytest.mark.parametrize("which", ["cluster", "stacks", "batches", "jobs", "health"])
async def test_each_screen_keeps_help_and_quit_at_80x24(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    recorded.write_batches_dump("dumps")
    app, steps = {
        "cluster": (ConsoleApp(None, recorded_monitor()), None),
        "stacks": (recorded.stacks_app(), recorded.open_stacks),
        "batches": (recorded.batches_app(), recorded.open_sample),
        "jobs": (recorded.jobs_app(), recorded.open_jobs),
        "health": (recorded.health_app(), recorded.open_health),
    }[which]
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        if steps is not None:
            await steps(pilot)
        keys = footer_text(app).split()
        assert keys[:2] == ["question_mark", "q"], keys
        # and both are drawn, not only listed: the footer line shows them
        footer = screen_text(app).splitlines()[-1]
        assert footer.startswith(" ? Help  q Quit"), footer


async def test_health_shows_metric_rows_at_80x24(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal_console.widgets.metric_table import MetricTable

    monkeypatch.chdir(tmp_path)
    app = recorded.health_app()
    async with app.run_test(size=SMALL) as pilot:
        await recorded.open_health(pilot)
        table = app.screen.query_one(MetricTable)
        rows_shown = table.scrollable_content_region.height - table.header_height
        assert table.row_count > 5 and rows_shown >= 5, (table.row_count, rows_shown)
        text = screen_text(app)
        # names that share their start keep their ends: cut in the middle, never the end
        assert "rollout/reward" in text and "task_reward/avg" in text
        assert "behave_imp_weight/avg" in text and "importance_weight/avg" in text
        # the warning and its remedy share one line, and the plot still shows
        assert "⚠ +1 more (w) ppo_actor/update/behave_imp_weight/avg = 1.39" in text
        assert "global step" in text


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_stacks_diff_shows_whole_function_names(size: tuple[int, int]) -> None:
    from areal_console.widgets.stack_diff import StackDiffView

    app = recorded.stacks_app()
    async with app.run_test(size=size) as pilot:
        await recorded.open_stacks(pilot, diff=True)
        view = app.screen.query_one(StackDiffView)
        assert view.diff is not None
        names = {f.function for r in view.diff.rows for f in (r.left, r.right) if f}
        assert "Trainer.cleanup_distributed" in names
        for i, row in enumerate(view.diff.rows):  # each row, scrolled into view
            view.move_cursor(row=i)
            await pilot.pause()
            text = screen_text(app)
            for frame in (row.left, row.right):
                if frame is None:
                    continue
                # whole wherever the half has room for it; else its start, then `…`
                fits = len(frame.function) <= view._side
                shown = frame.function if fits else frame.function[: view._side - 1] + "…"
                assert shown in text, (i, frame.function, view._side)
                assert f":{frame.line}" in text, (i, frame)
        if size == LARGE:  # the width is used: one line a frame, name and location whole
            assert "Trainer.cleanup_distributed  hang.py:177" in text
            assert "_exception_logger.<locals>.wrapper  c10d_logger.py:83" in text
            assert view.size.width >= 110, view.size


def test_frame_cell_cuts_the_file_before_the_function() -> None:
    from areal_console.core.stacks.records import Frame
    from areal_console.widgets.stack_diff import frame_cell

    frame = Frame("all_reduce_gradients", "/x/areal/reference_trainer.py", 1094)
    assert str(frame_cell(frame, "differ", 60)) == "all_reduce_gradients  reference_trainer.py:1094"
    short = str(frame_cell(frame, "differ", 36))
    assert short == "all_reduce_gradients  …ainer.py:1094", short
    assert len(short) == 36
    two = str(frame_cell(frame, "differ", 22, two_lines=True))
    assert two.splitlines() == ["all_reduce_gradients", "  …nce_trainer.py:1094"]


async def test_stacks_shows_every_group_beside_the_ledger_at_80x24() -> None:
    from areal_console.widgets.rank_group_table import RankGroupTable
    from textual.widgets import Label

    app = recorded.stacks_app("ledger_op")
    async with app.run_test(size=SMALL) as pilot:
        await recorded.open_stacks(pilot)
        table = app.screen.query_one(RankGroupTable)
        assert table.row_count >= 2
        assert table.size.height - table.header_height >= table.row_count
        assert table.rows_below() == 0
        title = str(app.screen.query_one("#groups-title", Label).render())
        assert title == f"Groups ({table.row_count} of {table.row_count})"
    # Where the rows cannot all show, the title says how many are below: the recording
    # with each rank stopped in a function of its own (a group each).
    raw = json.loads((recorded.PYSPY / "cleanup_deadlock.json").read_text())
    for sample in raw["nodes"][0]["samples"]:
        for dump in sample:
            for thread in dump.get("threads") or []:
                thread["frames"][0]["name"] = f"wait_{dump['pid']}"
    raw["id"] = "recorded-one-group-a-rank"
    capture = build_capture(raw)
    app = ConsoleApp(None, recorded_monitor())
    app.register_screen("stacks", lambda: StacksScreen(capture))
    async with app.run_test(size=(80, 14)) as pilot:
        await recorded.open_stacks(pilot)
        table = app.screen.query_one(RankGroupTable)
        await pilot.pause()
        below = table.rows_below()
        title = str(app.screen.query_one("#groups-title", Label).render())
        assert table.row_count >= 4 and below > 0, (table.row_count, below)
        assert title == f"Groups ({table.row_count} of {table.row_count}) +{below} below"
        await pilot.press("G")  # to the last group: none below it now
        await pilot.pause()
        assert table.rows_below() == 0


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_gpu_row_keeps_index_name_temperature_power(size: tuple[int, int]) -> None:
    app = recorded.h200_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        lines = screen_text(app).splitlines()
        header = next(line for line in lines if "TEMP" in line)
        row = lines[lines.index(header) + 1]
        for column in ("GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER"):
            assert column in header, (column, header)
        # the recorded NVML values: index 0, H200, 100% busy, 7.4G of 140.4G, 58°C, 651 W
        for value in (" 0 ", "H200", "100%", "7.4G/140.4G", "58°C", "651 W"):
            assert value in row, (value, row)
        assert "…" not in row
        assert ("HISTORY" in header) == (size == LARGE)


async def test_cluster_command_readable_at_80x24() -> None:
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "python -u gloo_ranks.py" in text  # not `/root/.p`
        assert "/root/" not in text


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_jobs_verdict_uncut_with_long_job_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int]
) -> None:
    from areal_console.widgets.vim_table import VimTable

    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    named = long_named_jobs()
    monkeypatch.setattr(recorded, "recorded_jobs", lambda: named)
    app = recorded.jobs_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("4")
        await pilot.pause()
        table = app.screen.query_one("#jobs-table", VimTable)
        await until(pilot, lambda: table.row_count == 3)
        await recorded.until_drawn(pilot)
        text = screen_text(app)
        assert "differs at step 12: behave_imp_weight" in text, text
        # At 80 columns exit and GPUs give way to the verdict; the detail below says both.
        spared = {"exit", "gpus"} - set(table.column_keys)
        assert spared == ({"exit", "gpus"} if size == SMALL else set()), table.column_keys
        assert f"{named[0].job_id} on node1, GPUs 0,1: finished (exit 0)" in text, text
        if size == SMALL:
            # Cut, each id keeps its unique end after an ellipsis (not `replay-202611` thrice).
            for record in named:
                shown = next(line for line in text.splitlines() if record.job_id[-12:] in line)
                assert "…" in shown and record.job_id not in shown, text
        for key in ("state", "verification", "node", "steps"):
            column = table.columns[key]  # type: ignore[index]
            widest = max(len(str(table.get_cell(r, key))) for r in table.rows)
            assert column.content_width >= widest, key


async def test_batches_samples_and_warnings_readable_at_80x24(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from textual.widgets import DataTable

    monkeypatch.chdir(tmp_path)
    recorded.write_batches_dump("dumps")
    app = recorded.batches_app()
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, BatchesScreen))
        samples = app.screen.query_one("#samples", DataTable)
        summary = app.screen.query_one("#summary", Static)
        await until(pilot, lambda: samples.row_count == 12 and "seq_len" in str(summary.render()))
        await recorded.until_drawn(pilot)
        # the warnings come before the figures: on screen with the step list focused
        text = screen_text(app)
        assert "! no_eos_ratio" in text
        # every sample column whole: the table fits its pane, the labels uncut
        labels = [str(c.label) for c in samples.columns.values()]
        assert labels == ["#", "grp", "resp", "reward", "eos", "ver"]
        width = sum(c.get_render_width(samples) for c in samples.columns.values())
        assert width <= samples.scrollable_content_region.width
        header = next(line for line in text.splitlines() if "grp" in line)
        assert "reward  eos  ver" in header
        await recorded.open_sample(pilot)
        assert "10..11" in screen_text(app)  # a version cell, whole


@pytest.mark.parametrize("width", [50, 60, 78, 120, 158])
def test_gpu_pane_fits_its_width_figures_first(width: int) -> None:
    """The recorded H200 drawn by the pane's own renderer at `width` cells: the figures in
    every width from 50 cells, uncut; the bars only where they fit."""
    from areal_console.widgets.gpu_pane import render_gpus
    from rich.console import Console

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render_gpus(recorded.h200_views()[0], width))
    lines = console.export_text().splitlines()
    assert all(len(line.rstrip()) <= width for line in lines), lines
    row = lines[1]
    for value in ("0", "H200", "100%", "7.4G/140.4G", "58°C", "651 W"):
        assert value in row, (value, row)
    assert ("█" in row) == (width >= 60)


async def test_a_stalled_run_with_warnings_keeps_five_metric_rows_at_80x24(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stall banner and three warning episodes: one counted line until `w` opens the
    list (it took the rows: 2-3 metric rows were left)."""
    from areal_console.core.metrics.health import BEHAVE_IMP_WEIGHT, IMPORTANCE_WEIGHT
    from areal_console.core.metrics.locate import HealthTarget
    from areal_console.widgets.health_banner import HealthBanner
    from areal_console.widgets.metric_table import MetricTable

    from tests.support.areal_logfmt import actor_stats, write_run

    def bad(step: int) -> dict[str, float]:
        over = {BEHAVE_IMP_WEIGHT: 1.0 + 0.01 * step}
        if 30 <= step <= 32:
            over[IMPORTANCE_WEIGHT] = 1.4
        if step >= 35:
            over["ppo_actor/no_eos_ratios/avg"] = 0.9
        return actor_stats(step, **over)

    monkeypatch.chdir(tmp_path)
    write_run(Path("run"), 40, stats=bad, finished=False)  # its last step long ago: stalled
    app = ConsoleApp(None, recorded.recorded_monitor(), health_target=HealthTarget("run"))
    async with app.run_test(size=SMALL) as pilot:
        await recorded.open_health(pilot)
        screen = app.screen
        report = screen.report
        assert report is not None and report.stall.stalled
        checks = [w for w in report.warnings if w.check != "stalled"]
        assert len(checks) >= 2, checks
        table = screen.query_one(MetricTable)
        rows_shown = table.scrollable_content_region.height - table.header_height
        assert rows_shown >= 5, rows_shown
        text = screen_text(app)
        assert "STALLED" in text and f"+{len(checks) - 1} more (w)" in text
        await pilot.press("w")  # the whole list, the ended episodes marked as ended
        await pilot.pause()
        text = screen_text(app)
        assert "✓ ended, steps 30-32: ppo_actor/update/importance_weight/avg" in text
        banner = screen.query_one(HealthBanner)
        assert banner.expanded
