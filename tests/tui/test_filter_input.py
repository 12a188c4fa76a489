"""One `/` filter behaviour on every screen: `/` opens and focuses the box, typing filters,
enter goes back to the table with the filter on, escape clears it and closes the box, and
only the next escape is the screen's own."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from areal_console.app import ConsoleApp
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.cluster import ClusterScreen
from areal_console.widgets.filter_input import FilterHost, FilterInput
from areal_console.widgets.process_table import ProcessTable
from textual.binding import Binding
from textual.widgets import DataTable

from tests.support.fixtures import batch_dumps as bf
from tests.support.recorded import recorded_monitor
from tests.support.waits import until

SCREENS = Path(__file__).resolve().parents[2] / "tui" / "areal_console" / "screens"


def test_every_screen_with_a_filter_key_uses_the_one_filter() -> None:
    with_filter = []
    for path in sorted(SCREENS.glob("*.py")):
        module = importlib.import_module(f"areal_console.screens.{path.stem}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            actions = {b.action for b in getattr(cls, "BINDINGS", []) if isinstance(b, Binding)}
            if "filter" in actions:
                with_filter.append(cls.__name__)
                assert issubclass(cls, FilterHost), f"{cls.__name__}: `/` without FilterHost"
        # No screen opens, clears or hides a filter box itself.
        defined = {n.name for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.FunctionDef)}  # fmt: skip
        assert not defined & {"action_filter", "_filter_changed", "_filter_done"}, path.name
    assert sorted(with_filter) == [
        "BatchesScreen", "ClusterScreen", "HealthScreen", "RunsScreen", "SlurmJobsScreen",
        "StacksScreen",
    ]  # fmt: skip


async def test_cluster_filter_opens_filters_hides_on_enter_and_escape_clears() -> None:
    app = ConsoleApp(None, recorded_monitor())
    async with app.run_test(size=(130, 36)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        table = screen.query_one(ProcessTable)
        await until(pilot, lambda: table.row_count > 1, what="process rows")
        everything = table.row_count
        box = screen.query_one(FilterInput)
        assert not box.display
        await pilot.press("slash", *" 4103 ")
        assert box.display and box.has_focus
        await until(pilot, lambda: table.row_count == 1, what="the filtered row")
        assert screen.text_filter == "4103"  # surrounding spaces dropped
        await pilot.press("enter")  # the status line shows the filter: the box hides
        assert not box.display and table.has_focus and screen.text_filter == "4103"
        assert "filter: '4103'" in str(screen.query_one("#status").render())
        await pilot.press("escape")  # clears the filter, closed box or not
        assert screen.text_filter == "" and box.value == "" and table.row_count == everything
        # The palette's jump: drilled into a node, filtered by a pid. Escape clears the
        # filter first, and only the next one leaves the node.
        screen.show_node("node1", text_filter="4103")
        await until(pilot, lambda: table.row_count == 1, what="the palette's filter")
        await pilot.press("escape")
        assert screen.text_filter == "" and screen.drilled == "node1"
        await pilot.press("escape")
        assert screen.drilled is None


async def test_batches_filter_stays_open_on_enter_and_escape_closes_it(tmp_path: Path) -> None:
    bf.write_trajectory_dump(tmp_path, steps=[1], dp_size=1, n_groups=3, group_size=2)
    app = ConsoleApp(None, recorded_monitor(), batches_path=str(tmp_path))
    async with app.run_test(size=(130, 36)) as pilot:
        await pilot.press("3")
        screen = app.screen
        assert isinstance(screen, BatchesScreen)
        samples = screen.query_one("#samples", DataTable)
        await until(pilot, lambda: samples.row_count == 6, what="samples")
        await pilot.press("slash", *"group=1")
        box = screen.query_one(FilterInput)
        assert box.has_focus
        await until(pilot, lambda: samples.row_count == 2, what="the filtered samples")
        await pilot.press("enter")  # back to the table; the box stays up with the filter
        assert box.display and samples.has_focus and box.value == "group=1"
        await pilot.press("escape")
        assert not box.display and screen.text_filter == "" and samples.row_count == 6
        assert samples.has_focus and isinstance(app.screen, BatchesScreen)
