"""The process view as htop/nvitop users expect it, on a real gloo job through the real
local agent: enter shows a process in full with its stack one key away, sort keys, vim
keys, the GPU memory column, one-line command lines, and a click that selects."""

from __future__ import annotations

from collections.abc import Callable

from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.core.connection.records import ProcessRow
from areal_console.core.targets.resolve import local_node
from areal_console.dialogs.process_detail import ProcessDetailScreen
from areal_console.widgets.node_table import NodeTable
from areal_console.widgets.process_table import ProcessTable, one_line, process_cells
from conftest import GlooJob
from textual.widgets import Static

from tests.support import waits


async def until(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    await waits.until(None, condition, timeout, what or "condition")


def text_of(screen: ProcessDetailScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def test_enter_on_a_rank_shows_it_in_full_and_s_dumps_its_stack(gloo_job: GlooJob) -> None:
    node = local_node().name
    pid = gloo_job.rank_pids()[1]
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.screen.query_one(ProcessTable)
        key = f"{node}:{pid}"
        await until(lambda: key in table.rows, what="rank 1's row")
        await pilot.press("slash", *str(gloo_job.workdir), "enter")  # this job only
        await until(lambda: table.row_count == 5, what="the job's rows only")
        table.move_cursor(row=table.get_row_index(key))
        await pilot.press("enter")
        await until(lambda: isinstance(app.screen, ProcessDetailScreen), what="the detail")
        detail = app.screen
        assert isinstance(detail, ProcessDetailScreen)
        info = text_of(detail, "#process-info")
        assert f"{pid}" in info and "1 of world size 4" in info
        assert "RANK=1" in info and "WORLD_SIZE=4" in info and "MASTER_PORT=" in info
        assert f"gloo_ranks.py {gloo_job.workdir}" in info  # the whole command line
        assert "GPU memory" in info
        await pilot.press("s")
        await until(lambda: "stack of pid" in text_of(detail, "#process-stack"), what="stack")
        stack = text_of(detail, "#process-stack")
        assert "barrier" in stack and "gloo_ranks.py" in stack
        await pilot.press("l")
        await until(lambda: "with locals" in text_of(detail, "#process-stack"), what="locals")
        assert "ready_dir = " in text_of(detail, "#process-stack")
        await pilot.press("escape")
        await until(lambda: not isinstance(app.screen, ProcessDetailScreen), what="back")


def _view(processes: list[dict]) -> NodeView:
    return NodeView("gpu-node", "10.0.0.1", "up", sample={"processes": processes, "gpus": []})


def _row(record: dict) -> ProcessRow:
    row = ProcessRow.from_agent(record)
    assert row is not None
    return row


def _proc(pid: int, rank: int, cpu: float, rss: int, gpu: int | None, cmd: str) -> dict:
    return {"pid": pid, "ppid": 1, "rank": rank, "world_size": 3, "local_rank": rank,
            "role": "trainer", "cpu_percent": cpu, "rss": rss, "state": "S", "gpus": [rank],
            "gpu_memory": gpu, "cmdline": cmd}  # fmt: skip


async def test_sort_keys_vim_keys_gpu_memory_and_one_line_commands() -> None:
    multi = 'python -c "import torch\nimport time\ntime.sleep(9)"'
    views = [_view([
        _proc(101, 0, 5.0, 3 << 30, 4 << 30, "python train.py"),
        _proc(102, 1, 90.0, 1 << 30, 9 << 30, multi),
        _proc(103, 2, 40.0, 7 << 30, None, "python train.py"),
    ])]  # fmt: skip
    app = ConsoleApp(None, RecordedMonitor(views))
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.screen.query_one(ProcessTable)
        await until(lambda: table.row_count == 3, what="rows")

        def pids() -> list[str]:
            return [str(table.get_row_at(i)[4]) for i in range(table.row_count)]

        assert pids() == ["101", "102", "103"]  # rank order
        assert str(table.get_cell("gpu-node:102", "gpumem")) == "9.0G"
        assert str(table.get_cell("gpu-node:103", "gpumem")) == "-"
        cmd = str(table.get_cell("gpu-node:102", "cmd"))
        assert "\n" not in cmd and cmd == 'python -c "import torch ⏎ import time ⏎ time.sleep(9)"'
        await pilot.press("P")
        await until(lambda: pids() == ["102", "103", "101"], what="CPU order")
        await pilot.press("M")
        await until(lambda: pids() == ["103", "101", "102"], what="RSS order")
        await pilot.press("V")
        await until(lambda: pids() == ["102", "101", "103"], what="GPU memory order")
        await pilot.press("V")  # again: back to rank order
        await until(lambda: pids() == ["101", "102", "103"], what="rank order")
        await pilot.press("p", "G")
        assert table.cursor_row == 2
        await pilot.press("k")
        assert table.cursor_row == 1
        await pilot.press("g")
        assert table.cursor_row == 0
        await pilot.press("j")
        assert table.cursor_row == 1


async def test_a_click_selects_the_node_and_updates_its_panes() -> None:
    views = [_view([_proc(101, 0, 5.0, 1 << 30, None, "python a.py")]),
             NodeView("other", "10.0.0.2", "down", error="connection refused")]  # fmt: skip
    app = ConsoleApp(None, RecordedMonitor(views))
    async with app.run_test(size=(120, 36)) as pilot:
        nodes = app.screen.query_one(NodeTable)
        await until(lambda: nodes.row_count == 2, what="nodes")
        assert nodes.cursor_row == 0
        await pilot.click(NodeTable, offset=(3, 2))  # the second node's row (under the header)
        await until(lambda: nodes.cursor_row == 1, what="the click to move the cursor")
        gpus = str(app.screen.query_one("#gpus-title").render())
        assert "other" in gpus
        # One click was enough: the node is drilled into (selected), as enter does.
        await until(lambda: getattr(app.screen, "drilled", None) == "other", what="drill")


def test_cells_of_a_process_without_gpu_data() -> None:
    cells = process_cells("n", _row(_proc(1, 0, 1.0, 1, None, "a\n\nb")))
    assert cells["gpumem"] == "-" and str(cells["cmd"]) == "a ⏎ b"
    assert one_line("plain") == "plain"
    # An argument with escape sequences and markup shows as text, never as markup.
    hostile = process_cells("n", _row(_proc(1, 0, 1.0, 1, None, "x \x1b]0;t\x07[red]y[/bold]")))
    assert str(hostile["cmd"]) == "x \\x1b]0;t\\x07[red]y[/bold]"
