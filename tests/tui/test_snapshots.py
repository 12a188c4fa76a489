"""SVG snapshots of top-level screens in the app shell at 130x36, from recorded data (no
clock, no host names, no pids of this machine); screenshots/ comes from the same apps and
steps (scripts/export_screenshots.py). Batches and Jobs have theirs beside their other
tests (test_batches_screen.py, test_replay_snapshots.py)."""

from __future__ import annotations

from typing import Any

import pytest
from areal_console.app import ConsoleApp

from tests.support import recorded
from tests.support.recorded import SIZE, recorded_monitor


def test_cluster_screen_snapshot(snap_compare: Any) -> None:
    app = ConsoleApp(None, recorded_monitor())
    assert snap_compare(app, terminal_size=SIZE)


def test_cluster_servers_snapshot(snap_compare: Any) -> None:
    """The Servers pane: a healthy SGLang server, a data proxy paused on an older version
    than the trainer's (its lag beyond `rollout.max_head_offpolicyness`), a vLLM server
    with its KV cache full (flags with evidence and config key below)."""
    app = ConsoleApp(None, recorded.servers_monitor())
    assert snap_compare(app, terminal_size=SIZE)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=["80x24", "160x45"])
def test_cluster_4096_ranks_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    """A simulated fleet of 512 nodes x 8 ranks (the recorded node, 512 times:
    `recorded.scale_fleet_views`), two of them down: the status line names the 4,080 ranks
    shown as ranges, the down nodes and why."""

    async def drawn(pilot: Any) -> None:
        from areal_console.widgets.process_table import ProcessTable

        from tests.support.waits import until

        table = pilot.app.screen.query_one(ProcessTable)
        await until(pilot, lambda: table.row_count == 4080 and table.keys_in_view())
        await pilot.pause()

    app = recorded.scale_fleet_app()
    assert snap_compare(app, terminal_size=size, run_before=drawn)


@pytest.mark.slow
def test_stacks_screen_snapshot(snap_compare: Any) -> None:
    """A recorded capture of a hung job and its diagnosis."""
    assert snap_compare(recorded.stacks_app(), terminal_size=SIZE, run_before=recorded.open_stacks)


@pytest.mark.slow
def test_stacks_ledger_snapshot(snap_compare: Any) -> None:
    """A recorded capture with Flight Recorder traces: the collective ledger beside the
    groups and the mismatch named by sequence id in the diagnosis."""
    app = recorded.stacks_app("ledger_op")
    assert snap_compare(app, terminal_size=SIZE, run_before=recorded.open_stacks)


@pytest.mark.slow
def test_stacks_diff_snapshot(snap_compare: Any) -> None:
    """Two rank groups side by side, their first differing frame marked."""

    async def diff(pilot: Any) -> None:
        await recorded.open_stacks(pilot, diff=True)

    assert snap_compare(recorded.stacks_app(), terminal_size=SIZE, run_before=diff)


@pytest.mark.slow
def test_stacks_deadlock_snapshot(snap_compare: Any) -> None:
    """A capture of a real deadlock between groups (tests/jobs/fr_ranks.py wrong_group:
    rank 3 passed the tp group), as `stacks` saved it: the diagnosis names the cycle and
    the ledger pane leads with it."""
    app = recorded.saved_stacks_app("saved_wrong_group")
    assert snap_compare(app, terminal_size=SIZE, run_before=recorded.open_stacks)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=["80x24", "160x45"])
def test_stacks_4096_ranks_snapshot(snap_compare: Any, size: tuple[int, int]) -> None:
    """4,096 AReaL workers (512 nodes of 8), three threads of ~50 frames each: all but five
    wait in a barrier, five are still in the training step's all_reduce. The groups and
    the diagnosis name rank sets as ranges, the outliers in one short line."""
    app = recorded.scale_stacks_app()
    assert snap_compare(app, terminal_size=size, run_before=recorded.open_stacks)


def test_stacks_worker_server_snapshot(snap_compare: Any) -> None:
    """A capture `stacks` saved from a real hung job of `nobody` by a console without
    CAP_SYS_PTRACE (scripts/record_worker_server_fixture.py): every stack from the ranks'
    worker servers, which the status line says."""
    app = recorded.saved_stacks_app("saved_worker_server")
    assert snap_compare(app, terminal_size=SIZE, run_before=recorded.open_stacks)
