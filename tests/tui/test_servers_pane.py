"""The Servers pane on the Cluster screen: rows from the poller's state of real stand-in
servers (tests/jobs/standin_server.py), the fleet's version skew, flags with their
evidence and config key, and remote text escaped."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.core.connection.records import ServerRow
from areal_console.core.rollout.jobs import Run
from areal_console.core.rollout.servers import throughput_trend
from areal_console.core.rollout.trainer_watch import TrainerState, TrainerStates
from areal_console.widgets.servers_pane import ServersPane
from areal_node.server_poll import ServerPoller
from textual.widgets import Label, Static

from tests.support.waits import until
from tests.unit.test_server_poll import Standin, target

DATA = Path(__file__).resolve().parents[1] / "data"


def server_process(pid: int, kind: str, port: int, state: dict[str, Any]) -> dict[str, Any]:
    """A process record as the agent reports a server: its `server` with the poll's state."""
    return {
        "pid": pid, "ppid": 1, "cmdline": f"python3 -m areal.v2.inference_service.{kind} --port {port}",
        "rank": None, "local_rank": None, "world_size": None, "role": "sglang" if kind != "vllm" else "vllm",
        "cpu_percent": 1.0, "rss": 1 << 30, "state": "S", "gpus": [0], "gpu_memory": 1 << 33,
        "server": {"kind": kind, "url": f"http://127.0.0.1:{port}/health", "host": "127.0.0.1", "port": port,
                   "health": {"ok": True, "status": 200, "latency_ms": 3.0}, **state},
    }  # fmt: skip


def node_view(processes: list[dict[str, Any]]) -> NodeView:
    sample = json.loads((DATA / "cluster_recording.json").read_text())
    sample["processes"] = sample["processes"][:2] + processes
    return NodeView("node1", "alice@127.0.0.2:2201", "up", None, 0.004, sample, 0.0)


def test_trend_scales_to_its_own_maximum() -> None:
    assert throughput_trend((0.0, 500.0, 1000.0), width=3) == "▁▅█"
    assert throughput_trend((), width=4) == "    "
    assert throughput_trend((float("nan"), -1.0, 10.0), width=1) == "█"


async def test_pane_shows_polled_servers_flags_and_skew(tmp_path: Path) -> None:
    a = Standin(tmp_path / "a", "--kind", "sglang", "--version", "7", "--throughput", "2100")
    b = Standin(tmp_path / "b", "--kind", "data_proxy", "--paused", "--version", "6")
    poller = ServerPoller(workers=2, interval=0.1)
    try:
        targets = [target(a, "sglang"), target(b, "data_proxy")]
        deadline = time.monotonic() + 15
        while True:
            state = poller.state(targets)
            if all(len(v["throughput"]) >= 2 or v.get("paused") for v in state.values()):
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.1)
    finally:
        poller.close()
        a.stop()
        b.stop()
    sg = state[f"sglang|127.0.0.1|{a.port}"]
    proxy = state[f"data_proxy|127.0.0.1|{b.port}"]
    procs = [
        server_process(a.proc.pid, "sglang", a.port, sg),
        server_process(b.proc.pid, "data_proxy", b.port, proxy),
    ]
    row = ServerRow.from_agent(procs[0]["server"])
    assert (
        row is not None and row.weight_version == 7 and row.metric("sglang:gen_throughput") == 2100
    )

    app = ConsoleApp(None, RecordedMonitor([node_view(procs)]))
    async with app.run_test(size=(160, 44)) as pilot:
        pane = app.screen.query_one(ServersPane)
        await until(pilot, lambda: pane.row_count == 2, what="two server rows")
        cells = {key.value: [str(c) for c in pane.get_row(key)] for key in pane.rows}
        sg_row = cells[f"node1:{a.proc.pid}"]
        assert sg_row[1:8] == [f"127.0.0.1:{a.port}", "sglang", "ok 3ms", "unknown", "7", "4", "0"]
        assert (
            sg_row[8] == "35%"
            and sg_row[9] == "2100"
            and sg_row[10].strip() == "█" * len(sg["throughput"])
        )
        proxy_row = cells[f"node1:{b.proc.pid}"]
        assert proxy_row[3:6] == ["ok 3ms", "PAUSED", "6"]
        assert (
            proxy_row[11] == "version_skew"
        )  # 6 beside 7: the odd one out (a tie, the higher wins)
        flags = str(app.screen.query_one("#server-flags", Static).render())
        assert f"127.0.0.1:{b.port} version_skew: serves version 6; most servers serve 7" in flags
        assert "[actor.weight_update_mode]" in flags


async def test_remote_text_in_the_pane_is_escaped() -> None:
    hostile = {
        "weight_version": "\x1b]2;pwned\x07",
        "paused": True,
        "metrics": {"sglang:num_running_reqs": 3},
        "flags": [
            {
                "kind": "paused_after_update",
                "evidence": "\x1b[2Jpaused for 999s",
                "remedy": "r",
                "config_key": "k",
            }
        ],
        "throughput": [1.0, "x", None, 2.0],
    }
    app = ConsoleApp(
        None, RecordedMonitor([node_view([server_process(4242, "data_proxy", 8082, hostile)])])
    )
    async with app.run_test(size=(160, 44)) as pilot:
        pane = app.screen.query_one(ServersPane)
        await until(pilot, lambda: pane.row_count == 1, what="the server row")
        cells = [str(c) for c in pane.get_row(next(iter(pane.rows)))]
        assert cells[5] == "\\x1b]2;pwned\\x07"
        flags = str(app.screen.query_one("#server-flags", Static).render())
        assert "\\x1b[2Jpaused for 999s" in flags and "\x1b" not in flags


async def test_pane_stays_hidden_without_servers() -> None:
    app = ConsoleApp(None, RecordedMonitor([node_view([])]))
    async with app.run_test(size=(130, 36)) as pilot:
        await pilot.pause()
        assert app.screen.query_one("#servers-box").display is False


async def test_the_trainers_version_raises_lag_and_paused_flags() -> None:
    """The live screen's trainer state (read from the job's files off the UI thread, here
    recorded): a server paused on an older version while the trainer moved on, and one
    further behind than `rollout.max_head_offpolicyness` allows."""
    procs = [
        server_process(4242, "data_proxy", 8082, {"weight_version": 5, "paused": True, "polled": True}),
        server_process(4243, "sglang", 30000, {"weight_version": 6, "paused": False, "polled": True}),
    ]  # fmt: skip
    run = Run("/tmp/areal/logs/alice/exp/t1", "alice", "exp/t1")
    state = TrainerState(7, "`Train step 7/9 done.` in main.log", 1, time.time(), run)
    trainer = TrainerStates((state,))
    app = ConsoleApp(None, RecordedMonitor([node_view(procs)], trainer=trainer))
    async with app.run_test(size=(160, 44)) as pilot:
        pane = app.screen.query_one(ServersPane)
        await until(pilot, lambda: pane.row_count == 2, what="two server rows")
        cells = {key.value: [str(c) for c in pane.get_row(key)] for key in pane.rows}
        assert cells["node1:4242"][11] == "version_skew, paused_after_update, version_lag"
        assert cells["node1:4243"][11] == "-"  # 1 behind, 1 allowed
        title = str(app.screen.query_one("#servers-title", Label).render())
        assert title == "Servers (2) · trainer on version 7 (max_head_offpolicyness 1)"
        flags = str(app.screen.query_one("#server-flags", Static).render())
        assert (
            "127.0.0.1:8082 paused_after_update: paused at version 5; the trainer is on version 7"
            in flags
        )
        assert "serves version 5, the trainer is on 7 (2 behind, allowed 1)" in flags
        assert "[rollout.max_head_offpolicyness]" in flags
    # Without the trainer's version only the skew is raised, and the title says no version.
    app = ConsoleApp(None, RecordedMonitor([node_view(procs)]))
    async with app.run_test(size=(160, 44)) as pilot:
        pane = app.screen.query_one(ServersPane)
        await until(pilot, lambda: pane.row_count == 2, what="two server rows")
        assert str(pane.get_row("node1:4242")[11]) == "version_skew"
        assert str(app.screen.query_one("#servers-title", Label).render()) == "Servers (2)"
