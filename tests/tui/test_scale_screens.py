"""The screens at 4,096 ranks: the Stacks screen diagnoses a 512-node capture and names
its outliers compactly; the palette, with one entry per rank, finds a rank and stays
bounded on a query every rank matches."""

from __future__ import annotations

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import RecordedMonitor
from areal_console.palette import MAX_SCORED, ConsoleCommands
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.rank_group_table import RankGroupTable
from textual.app import App

from tests.support import recorded
from tests.support.waits import until


@pytest.mark.slow
async def test_the_stacks_screen_diagnoses_4096_ranks() -> None:
    capture = recorded.scale_capture(4096)
    screen = StacksScreen(capture)

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen)

    async with Host().run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: screen.diagnosis is not None)
        await until(pilot, lambda: screen.query_one(RankGroupTable).shown)
        assert screen.diagnosis is not None
        assert screen.diagnosis.pattern == "collective_mismatch"
        evidence = "\n".join(screen.diagnosis.evidence)
        assert "ranks 999,1999,2999,3999,4095 (5): " in evidence
        assert "ranks 0-998,1000-1998,2000-2998,3000-3998,4000-4094 (4091): " in evidence
        assert len(screen.diagnosis.to_json()["detail"]) < 400  # no list of 4,096 names


async def _search(app: ConsoleApp, query: str) -> list[str]:
    provider = ConsoleCommands(app.screen)
    return [str(hit.match_display) async for hit in provider.search(query)]


async def test_the_palette_finds_one_rank_of_4096() -> None:
    app = ConsoleApp(None, RecordedMonitor(recorded.scale_views(512, 8)))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        found = await _search(app, "Rank 4095 on n511")
        assert "Rank 4095 on n511 (pid 24095)" in found
        broad = await _search(app, "rank")
        assert len(broad) == MAX_SCORED + 1
        assert broad[0] == "... 3,896 more entries match: type more of the name"
        assert all(label.startswith("Rank ") for label in broad[1:])


async def test_a_small_fleet_lists_every_match() -> None:
    app = ConsoleApp(None, RecordedMonitor(recorded.scale_views(4, 8)))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        found = await _search(app, "rank")
        assert len(found) == 32 and not any("more entries" in f for f in found)


def test_groups_filter_by_rank_set_node_and_role() -> None:
    from areal_console.core.common.rank_filter import rank_intervals
    from areal_console.core.stacks.merge import analyse
    from areal_console.widgets.rank_group_table import group_matches

    groups = analyse(recorded.scale_capture(4096)).groups
    big, small = sorted(groups, key=lambda g: -g.size)

    def shown(text: str) -> list[int]:
        return [g.size for g in (big, small) if group_matches(g, text)]

    assert shown("2049") == [4091]  # inside "0-998,...,2000-2998": not a substring of it
    assert shown("3999") == [5]
    assert shown("0-3,3999") == [4091, 5]
    assert shown("5000-999999999") == []  # one interval, never expanded
    assert rank_intervals("0-999999999") == [(0, 999_999_999)]
    assert rank_intervals("1-2,x") is None and rank_intervals("9" * 10) is None
    assert shown("node:node0511.txt") == [4091, 5]  # ranks 4088-4094 and 4095
    assert shown("node:node0001.txt") == [4091]  # ranks 8-15
    assert shown("role:actor") == [4091, 5] and shown("role:rollout") == []
