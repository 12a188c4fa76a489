"""The Cluster status line counts the ranks the screen shows: under the filter, on the
drilled-in node, with the world size of the job shown."""

from __future__ import annotations

from typing import Any

from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.screens.cluster import status_text
from areal_console.widgets.status_line import StatusLine

from tests.support import waits


def rank(pid: int, r: int, world: int, cmdline: str) -> dict[str, Any]:
    return {"pid": pid, "ppid": 1, "rank": r, "world_size": world, "role": "trainer",
            "cmdline": cmdline}  # fmt: skip


def two_jobs() -> list[NodeView]:
    """A 2-rank demo job on n1, beside another user's 5-rank job on n1 and n2."""
    demo = "python3 -m areal_node.trainer --tag demo-7f3a"
    other = "python3 train.py --config big.yaml"
    n1 = [rank(10, 0, 2, demo), rank(11, 1, 2, demo), rank(20, 0, 5, other), rank(21, 1, 5, other)]
    n2 = [rank(30 + r, r, 5, other) for r in (2, 3, 4)]
    n2.append({"pid": 99, "ppid": 1, "rank": None, "world_size": None, "role": None,
               "cmdline": "python3 -m jupyter"})  # fmt: skip
    return [
        NodeView("n1", "10.0.0.1", "up", sample={"processes": n1, "gpus": []}),
        NodeView("n2", "10.0.0.2", "up", sample={"processes": n2, "gpus": []}),
    ]


def test_the_filter_counts_only_the_job_shown() -> None:
    views = two_jobs()
    assert status_text(views, None, "demo-7f3a", False) == (
        "2/2 nodes up · 2 ranks of world size 2 · filter: 'demo-7f3a'"
    )
    assert status_text(views, None, "big.yaml", False).startswith(
        "2/2 nodes up · 5 ranks of world size 5 ·"
    )
    assert status_text(views, None, "", False) == "2/2 nodes up · 7 ranks (world sizes 2, 5)"
    assert status_text(views, None, "no-such-job", False).startswith("2/2 nodes up · 0 ranks ·")


def test_a_drilled_in_node_counts_its_own_ranks() -> None:
    views = two_jobs()
    assert status_text(views, "n2", "", False).startswith(
        "2/2 nodes up · 3 ranks 2-4 of world size 5"  # not all of 0-4: the set is named
    )
    assert status_text(views, "n2", "demo-7f3a", False).startswith("2/2 nodes up · 0 ranks")


async def test_the_screen_says_the_filtered_count_at_80_and_160_columns() -> None:
    for size in ((80, 24), (160, 45)):
        app = ConsoleApp(None, RecordedMonitor(two_jobs()), initial_filter="demo-7f3a")
        async with app.run_test(size=size) as pilot:

            def said(app: ConsoleApp = app) -> str:
                return app.screen.query_one(StatusLine)._said or ""

            await waits.until(pilot, lambda: "nodes up" in said(), 10, "the status line")
            assert said().startswith("2/2 nodes up · 2 ranks of world size 2"), size
