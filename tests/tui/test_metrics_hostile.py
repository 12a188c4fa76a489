"""A run's log and event files are the job's: written by another user, possibly, and
read as hostile. Large logs are read whole; a progress line with an absurd number is not
a progress line; a tensorboard record with an impossible length is an error for its file,
and one that fails its CRC is skipped and said, never a silent end of the run."""

from __future__ import annotations

import datetime
import json
import re
import struct
from pathlib import Path

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.metrics.locate import HealthTarget
from areal_console.screens.health import HealthScreen
from areal_console.widgets.health_banner import HealthBanner
from areal_console.widgets.metric_table import MetricTable
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tests.conftest import run_cli
from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, tabulate_stats
from tests.support.recorded import SIZE, recorded_monitor
from tests.support.waits import until

BIG = "9" * 5000  # past int()'s 4,300 digits


def run_with_a_huge_progress_line(log_dir: Path) -> None:
    """40 steps; step 20's progress line carries 5,000-digit numbers."""
    writer = AReaLLogWriter(log_dir)
    writer.now = writer.start = 1_700_000_000.0
    for step in range(40):
        writer.now += 30
        if step == 20:
            writer.info("StatsLogger", f"Epoch 1/1 Step {BIG}/{BIG} Train step {BIG}/{BIG} done.")
            writer.info("StatsLogger", "Stats (1/1):")
            writer.info("StatsLogger", "\n" + tabulate_stats(actor_stats(step)))
        else:
            writer.commit(0, step, step, actor_stats(step))
    writer.close()


def test_a_progress_line_with_a_huge_number_is_not_a_crash(tmp_path: Path) -> None:
    run_with_a_huge_progress_line(tmp_path)
    result = run_cli("metrics", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert doc["steps"] == list(range(40)) and not doc["stalled"]


async def test_the_health_screen_shows_a_run_with_a_huge_progress_line(tmp_path: Path) -> None:
    run_with_a_huge_progress_line(tmp_path)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        assert isinstance(app.screen, HealthScreen)
        table = app.screen.query_one(MetricTable)
        await until(pilot, lambda: table.row_count == len(actor_stats(0)), what="the metrics")
        assert "finished" in str(app.screen.query_one(HealthBanner).render())


@pytest.mark.slow
def test_a_finished_log_larger_than_one_read_is_read_whole(tmp_path: Path) -> None:
    """3,000 steps of ~24 KB (72 MB, past the 64 MB one poll reads): every step, finished."""
    one = AReaLLogWriter(tmp_path / "one")
    one.now = one.start = 1_700_000_000.0
    wide = {f"extra/m{i}/avg": 0.5 + i for i in range(50)}
    one.commit(0, 0, 0, {**actor_stats(0), **wide})
    one.release()
    record = (tmp_path / "one" / "main.log").read_bytes()
    stamp = re.search(rb"\d{8}-\d\d:\d\d:\d\d\.\d{3}", record)
    assert stamp is not None
    steps = 3000
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "main.log", "wb") as fh:
        for i in range(steps):
            at = datetime.datetime.fromtimestamp(one.start + 30 * i)
            fh.write(record.replace(stamp.group(), at.strftime("%Y%m%d-%H:%M:%S.000").encode()))
    assert (run / "main.log").stat().st_size > 64 << 20
    last = AReaLLogWriter(run)
    last.now = one.start + 30 * steps
    last.close()
    result = run_cli("metrics", str(run), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["steps"]) == steps and doc["steps"][-1] == steps - 1
    assert doc["stalled"] is False and doc["unread_bytes"] == 0


def event_run(tmp_path: Path, steps: int = 10) -> Path:
    """A real tensorboardX event file of `steps` steps (as AReaL's StatsLogger writes)."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    for step in range(steps):
        writer.add_scalar("ppo_actor/task_reward/avg", 0.1 * step, step)
    writer.close()
    (events,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    return events


def records(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of every record of an event file."""
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append((at, length))
        at += 12 + length + 4
    return out


def test_a_record_with_an_impossible_length_is_an_error_for_its_file(tmp_path: Path) -> None:
    events = event_run(tmp_path)
    head = struct.pack("<Q", 1 << 40)
    with open(events, "ab") as fh:  # a valid header CRC: only the length is hostile
        fh.write(head + struct.pack("<I", masked_crc32c(head)) + b"x" * 64)
    only = tmp_path / "only" / events.name
    only.parent.mkdir()
    only.write_bytes(events.read_bytes()[-(12 + 64) :])

    result = run_cli("metrics", str(events), "--json")  # the steps before it are kept
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert (
        "1099511627776 bytes" in result.stderr and "not an event file of scalars" in result.stderr
    )
    assert json.loads(result.stdout)["steps"] == list(range(10))

    result = run_cli("metrics", str(only))  # nothing readable: one line, exit 1
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and "not an event file of scalars" in result.stderr


async def test_the_health_screen_says_why_an_event_file_cannot_be_read(tmp_path: Path) -> None:
    head = struct.pack("<Q", 1 << 40)
    (tmp_path / "events.out.tfevents.1.host").write_bytes(
        head + struct.pack("<I", masked_crc32c(head))
    )
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        banner = app.screen.query_one(HealthBanner)
        await until(pilot, lambda: "no data" in str(banner.render()), what="the error")
        assert "not an event file of scalars" in str(banner.render())


def test_a_record_that_fails_its_crc_is_skipped_and_said(tmp_path: Path) -> None:
    events = event_run(tmp_path)
    data = bytearray(events.read_bytes())
    at, length = records(bytes(data))[3]  # record 0 is the file version; 3 is step 2
    data[at + 12 + length // 2] ^= 0xFF
    events.write_bytes(bytes(data))
    result = run_cli("metrics", str(events), "--json")
    assert result.returncode == 3, result.stderr
    assert f"the record at byte {at} fails its CRC check" in result.stderr
    assert json.loads(result.stdout)["steps"] == [0, 1, *range(3, 10)]  # not cut at step 2
