"""The Cluster screen keeps each process's RSS across samples while it is open: a real
process whose RSS grows beside a steady twin (tests/unit/test_sampling.py)."""

from __future__ import annotations

import subprocess

from tests.unit.test_sampling import ranks  # noqa: F401  (the fixture)


async def test_the_cluster_screen_keeps_rss_history_and_marks_growth(
    ranks: dict[str, subprocess.Popen[bytes]],  # noqa: F811
) -> None:
    """The Cluster screen, live on this machine's agent at 0.2 s: the growing rank's RSS
    cell gains a sparkline in red and the status line names it; its twin's stays dim."""
    from areal_console.app import ConsoleApp
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.targets.resolve import local_node
    from areal_console.widgets.process_table import ProcessTable
    from areal_console.widgets.status_line import StatusLine
    from rich.text import Text

    from tests.cluster.test_cluster_screen import until

    node = local_node().name
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(200, 50)):
        table = app.screen.query_one(ProcessTable)

        def rss(name: str) -> Text | None:
            key = f"{node}:{ranks[name].pid}"
            if key not in {k.value for k in table.rows}:
                return None
            cell = table.get_cell(key, "rss")
            return cell if isinstance(cell, Text) else None

        def growing_marked() -> bool:
            cell = rss("growing")
            return cell is not None and any("red" in str(s.style) for s in cell.spans)

        await until(growing_marked, timeout=30, what="the growing rank's RSS in red")
        steady = rss("steady")
        assert steady is not None and not any("red" in str(s.style) for s in steady.spans)
        status = str(app.screen.query_one(StatusLine).render())
        assert f"RSS growing: {node} pid {ranks['growing'].pid}" in status
        assert f"pid {ranks['steady'].pid}" not in status
