"""The Cluster screen driven with Pilot, on a real local agent and a real gloo job."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.targets.resolve import local_node
from areal_console.dialogs.help import HelpScreen
from areal_console.screens.cluster import ClusterScreen
from areal_console.widgets.gpu_pane import GpuPane
from areal_console.widgets.node_table import NodeTable
from areal_console.widgets.process_table import ProcessTable
from areal_console.widgets.status_line import StatusLine
from conftest import GlooJob

from tests.support import waits
from tests.support.cluster import free_port


async def until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    await waits.until(None, condition, timeout, what or "condition")


def cell(table: ProcessTable | NodeTable, row: str, column: str) -> str:
    return str(table.get_cell(row, column))


def job_rows(table: ProcessTable, node: str, job: GlooJob) -> dict[int, str]:
    """rank -> row key of this job's ranks in the process pane."""
    return {
        rank: f"{node}:{pid}"
        for rank, pid in job.rank_pids().items()
        if f"{node}:{pid}" in table.rows
    }


async def test_cluster_screen_shows_the_jobs_ranks_live(gloo_job: GlooJob) -> None:
    node = local_node().name
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, ClusterScreen)
        table = screen.query_one(ProcessTable)
        await until(lambda: len(job_rows(table, node, gloo_job)) == 4, what="four rank rows")
        rows = job_rows(table, node, gloo_job)
        for rank, key in rows.items():
            assert cell(table, key, "rank") == f"{rank}/4"
            assert cell(table, key, "local") == str(rank)
            assert cell(table, key, "role") == "trainer"
            assert "gloo_ranks.py" in cell(table, key, "cmd")
        # Rows stay in rank order.
        order = [table.get_row_at(i) for i in range(table.row_count)]
        at = table.column_keys.index("pid")  # after a JOB column while other jobs run here
        ours = {k.split(":")[1] for k in rows.values()}
        pids = [int(r[at]) for r in order if str(r[at]) in ours]
        assert pids == [gloo_job.rank_pids()[r] for r in range(4)]
        # The launcher is listed with its role.
        launcher_key = f"{node}:{gloo_job.launcher_pid}"
        await until(lambda: launcher_key in table.rows, what="launcher row")
        assert cell(table, launcher_key, "role") == "launcher"

        nodes = screen.query_one(NodeTable)
        assert cell(nodes, node, "state") == "up"
        # No GPU here: the pane says why instead of staying empty.
        gpu_text = str(screen.query_one(GpuPane).render())
        assert "NVML unavailable" in gpu_text
        status = str(screen.query_one(StatusLine).render())
        assert "1/1 nodes up" in status

        # `/` filters processes; esc clears the filter.
        await pilot.press("slash")
        await pilot.press(*"launcher")
        await until(
            lambda: (
                table.row_count >= 1
                and all(cell(table, k.value or "", "role") == "launcher" for k in table.rows)
            ),
            what="filter",
        )
        await pilot.press("enter", "escape")
        await until(lambda: len(job_rows(table, node, gloo_job)) == 4, what="filter cleared")

        # `?` lists the screen's keys with their descriptions.
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        rows = {key: (desc, tip) for key, desc, tip, _id in app.screen.bindings}
        assert rows["slash"][0] == "Filter" and "Filter nodes and processes" in rows["slash"][1]
        assert rows["q"][0] == "Quit" and rows["a"][0] == "All procs"
        # The console's own keys come before generic table navigation.
        keys = [key for key, _, _, _ in app.screen.bindings]
        assert keys.index("slash") < keys.index("up")
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)


async def test_killed_agent_shows_the_node_down_then_reconnects(gloo_job: GlooJob) -> None:
    node = local_node().name
    fleet = Fleet([local_node()])
    app = ConsoleApp(fleet, refresh_interval=0.2)
    async with app.run_test(size=(140, 40)):
        screen = app.screen
        nodes = screen.query_one(NodeTable)
        await until(lambda: node in nodes.rows and cell(nodes, node, "state") == "up", what="up")
        session = fleet.session(node)
        assert session.client is not None
        old_pid = session.client.channel.pid  # type: ignore[attr-defined]
        os.kill(old_pid, signal.SIGKILL)
        await until(lambda: cell(nodes, node, "state") == "down", what="node down")
        assert "killed by signal 9" in cell(nodes, node, "detail")
        # The console keeps running and brings the node back with a fresh agent.
        await until(lambda: cell(nodes, node, "state") == "up", timeout=30, what="node back up")
        assert session.client is not None
        assert session.client.channel.pid != old_pid  # type: ignore[attr-defined]
        table = screen.query_one(ProcessTable)
        await until(lambda: len(job_rows(table, node, gloo_job)) == 4, what="ranks again")


async def test_s_captures_the_filtered_job_and_diagnoses_it() -> None:
    """From the Cluster screen: filter to one hung job, press `s`, read the diagnosis."""
    from areal_console.screens.stacks import StacksScreen

    from tests.support.fixtures.hang import start_scenario

    job = start_scenario("collective_mismatch", nproc=2)
    try:
        job.wait_ready(120)
        app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
        async with app.run_test(size=(140, 40)) as pilot:
            table = app.screen.query_one(ProcessTable)
            await until(lambda: table.row_count > 0, what="processes")
            await pilot.press("slash", *str(job.state_dir), "enter")
            await pilot.press("s")
            await until(lambda: isinstance(app.screen, StacksScreen), what="the Stacks screen")
            stacks = app.screen
            assert isinstance(stacks, StacksScreen)
            await until(lambda: stacks.diagnosis is not None, timeout=60, what="a diagnosis")
            assert stacks.diagnosis is not None
            assert stacks.diagnosis.pattern == "collective_mismatch"
            assert stacks.capture is not None
            assert sorted(r.rank for r in stacks.capture.ranks if r.rank is not None) == [0, 1]
            # The capture was saved before it was shown, and esc goes back to the Cluster screen.
            from areal_console.core.stacks.store import list_captures

            assert any(c.capture_id == stacks.capture.capture_id for c in list_captures())
            await pilot.press("escape")
            await until(lambda: isinstance(app.screen, ClusterScreen), what="back to Cluster")
    finally:
        job.stop()


async def test_a_switches_to_all_processes_without_dropping_the_node(gloo_job: GlooJob) -> None:
    """`a` restarts the sample stream on the same link: the node never shows down."""
    node = local_node().name
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = app.screen
        nodes = screen.query_one(NodeTable)
        table = screen.query_one(ProcessTable)
        await until(lambda: node in nodes.rows and cell(nodes, node, "state") == "up", what="up")
        await until(lambda: len(job_rows(table, node, gloo_job)) == 4, what="rank rows")
        me = f"{node}:{os.getpid()}"  # this test's own Python process: listed only with `a`
        assert me not in table.rows
        seen: list[tuple[str, str]] = []

        def watch(condition: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                view = app.monitor.snapshot()[0]
                seen.append((view.state, view.error or ""))
                return condition()

            return check

        await pilot.press("a")
        await until(watch(lambda: me in table.rows), what="every Python process")
        await pilot.press("a")
        await until(watch(lambda: me not in table.rows), what="job processes only")
        assert len(job_rows(table, node, gloo_job)) == 4
        assert seen and all(state == "up" for state, _ in seen), sorted(set(seen))


async def test_two_jobs_on_one_node_get_a_job_column_and_their_own_counts(
    gloo_job: GlooJob, tmp_path: Path
) -> None:
    """A second real gloo job beside the shared one: a JOB column (each rank's rendezvous,
    the key `stacks --job` takes), each job's ranks together in rank order, the status line
    and the node's RANKS cell counting each job apart; filtered to one job, no JOB column."""
    second = GlooJob(2, tmp_path / "second", port=free_port())
    try:
        node = local_node().name
        app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
        async with app.run_test(size=(160, 45)) as pilot:
            screen = app.screen
            table = screen.query_one(ProcessTable)
            nodes = screen.query_one(NodeTable)
            await until(
                lambda: (
                    len(job_rows(table, node, gloo_job)) == 4
                    and len(job_rows(table, node, second)) == 2
                    and "job" in table.column_keys
                ),
                what="both jobs' ranks and a JOB column",
            )
            keys = {gloo_job: f"127.0.0.1:{gloo_job.port}", second: f"127.0.0.1:{second.port}"}
            order = [
                table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)
            ]
            for job, key in keys.items():
                rows = job_rows(table, node, job)
                assert {cell(table, row, "job") for row in rows.values()} == {key}
                at = [order.index(rows[rank]) for rank in sorted(rows)]
                assert at == list(range(at[0], at[0] + len(at))), (key, at)  # together, in order
            launcher = f"{node}:{gloo_job.launcher_pid}"
            assert cell(table, launcher, "job") == "-"  # torchrun itself has no rendezvous

            def said() -> str:
                return screen.query_one(StatusLine)._said or ""

            await until(
                lambda: (
                    f"{keys[gloo_job]}: 4 ranks of world size 4" in said()
                    and f"{keys[second]}: 2 ranks of world size 2" in said()
                ),
                what="counts per job",
            )
            assert "jobs · " in said()
            assert {"4", "2"} <= set(cell(nodes, node, "ranks").split("+"))

            await pilot.press("slash", *str(gloo_job.workdir), "enter")
            await until(lambda: "job" not in table.column_keys, what="one job: no JOB column")
            assert len(job_rows(table, node, gloo_job)) == 4
            assert not job_rows(table, node, second)
            assert said().startswith("1/1 nodes up · 4 ranks of world size 4")
    finally:
        second.stop()
