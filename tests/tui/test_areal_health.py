"""`areal-console --areal E/T`: the Health screen opens the job's log directory without a
path (from `--fileroot`), in the real app shell driven by Pilot."""

from __future__ import annotations

import os
from pathlib import Path

from areal_console.app import ConsoleApp
from areal_console.cli import build_parser
from areal_console.commands.options import target_options
from areal_console.commands.tui import health_target
from areal_console.core.metrics.locate import HealthTarget
from areal_console.core.targets.resolve import resolve_targets
from areal_console.screens.health import HealthScreen
from areal_console.widgets.metric_table import MetricTable

from tests.support.areal_logfmt import actor_stats, write_run
from tests.support.areal_name_resolve import nfs_add, worker_key
from tests.support.recorded import SIZE, recorded_monitor, wait_until

USER = "root" if os.geteuid() == 0 else os.environ.get("USER", "")


async def test_health_opens_the_areal_jobs_log_dir_from_fileroot(tmp_path: Path) -> None:
    root, fileroot = tmp_path / "nr", tmp_path / "fileroot"
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), "127.0.0.1:1")
    log_dir = fileroot / "logs" / USER / "exp" / "t1"
    write_run(log_dir, 5, finished=True)
    args = build_parser("tui").parse_args(
        ["tui", "--areal", "exp/t1", "--name-resolve-root", str(root), "--fileroot", str(fileroot)]
    )
    resolve_targets(target_options(args))  # the stale record only warns
    target = health_target(args)
    # This machine holds it; only the job user's files are read there.
    assert target == HealthTarget(str(log_dir), None, None, owner=USER)
    without = build_parser("tui").parse_args(
        ["tui", "--areal", "exp/t1", "--name-resolve-root", str(root)]
    )
    resolve_targets(target_options(without))
    assert health_target(without).match is not None  # found from the workers' command lines
    app = ConsoleApp(None, recorded_monitor(), health_target=target)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, HealthScreen)
        table = screen.query_one(MetricTable)
        await wait_until(pilot, lambda: table.row_count == len(actor_stats(0)))
