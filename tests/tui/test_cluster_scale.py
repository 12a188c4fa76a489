"""The Cluster screen at 512 nodes x 8 ranks (a simulated fleet: the recorded node, 512
times; tests/support/recorded.py `scale_fleet_views`): a refresh updates the rows on
screen only and rows that come into view catch up; the `/` filter takes rank sets, node:
and role: as the Stacks screen's group filter does, and the status line names the ranks
shown as ranges."""

from __future__ import annotations

from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import RecordedMonitor
from areal_console.screens.cluster import ClusterScreen
from areal_console.widgets.node_table import NodeTable
from areal_console.widgets.process_table import ProcessTable
from areal_console.widgets.status_line import StatusLine

from tests.support import recorded
from tests.support.waits import until

RANKS_UP = 4096 - 16  # n017 and n233 are down: ranks 136-143 and 1864-1871 missing


def cell(table: ProcessTable, key: str, column: str) -> str:
    return str(table.get_cell(key, column))


def said(app: ConsoleApp) -> str:
    return app.screen.query_one(StatusLine)._said or ""


def new_sample(app: ConsoleApp, cpu: float) -> None:
    """Every rank's CPU% moves to `cpu`, as a 1 Hz sample of a busy job does."""
    monitor = app.monitor
    assert isinstance(monitor, RecordedMonitor)
    for view in monitor.views:
        if view.sample is not None:
            for p in view.sample["processes"]:
                p["cpu_percent"] = cpu
            view.take_sample(view.sample)


async def test_a_refresh_updates_the_rows_in_view_and_rows_scrolled_in_catch_up() -> None:
    app = recorded.scale_fleet_app()
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        table = screen.query_one(ProcessTable)
        await until(pilot, lambda: table.row_count == RANKS_UP and table.keys_in_view())
        assert said(app).startswith(
            "510/512 nodes up · 4,080 ranks 0-135,144-1863,1872-4095 of world size 4096"
        )
        in_view = table.keys_in_view()
        assert 10 < len(in_view) < 45, len(in_view)
        last = table.coordinate_to_cell_key((table.row_count - 1, 0)).row_key.value
        assert last is not None and last not in in_view

        updates: list[int] = []
        real = table.update_cells

        def counted(changes: Any) -> None:
            changes = list(changes)
            updates.append(len(changes))
            real(changes)

        table.update_cells = counted  # type: ignore[method-assign]
        new_sample(app, 7.0)
        screen.refresh_view()
        await pilot.pause()
        assert all(cell(table, key, "cpu") == "7" for key in in_view)
        assert cell(table, last, "cpu") != "7"  # out of view: not touched
        assert sum(updates) <= len(in_view)  # one CPU% cell per row on screen, no more

        table.focus()
        await pilot.press("G")  # the last rank comes into view, up to date
        await pilot.pause()
        assert last in table.keys_in_view()
        assert cell(table, last, "cpu") == "7"
        assert all(cell(table, key, "cpu") == "7" for key in table.keys_in_view())


@pytest.mark.slow
async def test_the_filter_takes_rank_sets_node_and_role() -> None:
    """128 nodes (1,024 ranks, n017 down): enough for a typed filter to wait for enter."""
    app = recorded.scale_fleet_app(128)
    up = 1024 - 8
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        table = screen.query_one(ProcessTable)
        nodes = screen.query_one(NodeTable)
        await until(pilot, lambda: table.row_count == up)

        async def filter_by(text: str) -> None:
            await pilot.press("slash", *text, "enter")
            await pilot.pause()

        async def clear() -> None:
            await pilot.press("escape")
            await pilot.pause()
            assert table.row_count == up

        await filter_by("0-511,513-1023")  # everything but rank 512 (and the down node's)
        assert table.row_count == up - 1
        assert "n064:20512" not in table.rows  # rank 512's row
        assert said(app).startswith(
            "127/128 nodes up · 1,015 ranks 0-135,144-511,513-1023 of world size 1024"
        )
        assert nodes.row_count == 127  # n064 still holds ranks 513-519
        await clear()

        await filter_by("node:n127")
        assert sorted(table.rows) == [f"n127:{21_016 + i}" for i in range(8)]
        assert list(nodes.rows) == ["n127"]
        assert "8 ranks 1016-1023 of world size 1024" in said(app)
        await clear()

        await filter_by("1023")  # a rank...
        assert list(table.rows) == ["n127:21023"]
        await clear()
        await filter_by("21023")  # ...or a pid (the palette's jump to a rank filters by it)
        assert list(table.rows) == ["n127:21023"]
        await clear()

        await filter_by("role:trainer")
        assert table.row_count == up
        await clear()
        await filter_by("role:actor")
        assert table.row_count == 0 and nodes.row_count == 0
        assert "0 ranks" in said(app)
        await clear()

        await filter_by("n017")  # text, as before: the down node by name
        assert list(nodes.rows) == ["n017"] and table.row_count == 0
