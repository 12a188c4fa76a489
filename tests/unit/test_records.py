"""The typed rows of a live sample: the agent's JSON checked and converted once, here."""

from __future__ import annotations

import json
from pathlib import Path

from areal_console.core.connection.monitor import NodeView
from areal_console.core.connection.nodes import server_text
from areal_console.core.connection.records import (
    GpuRow,
    ProcessRow,
    ServerRow,
    gpu_rows,
    process_rows,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_recorded_sample_becomes_rows_with_every_field() -> None:
    sample = json.loads((DATA / "cluster_recording.json").read_text())
    view = NodeView("n", "10.0.0.1", "up", sample=sample)
    assert len(view.processes) == len(sample["processes"])
    assert len(view.gpus) == len(sample["gpus"])
    for row, raw in zip(view.processes, sample["processes"], strict=True):
        assert (row.pid, row.rank, row.world_size, row.role, row.cmdline) == (
            raw["pid"], raw["rank"], raw["world_size"], raw["role"], raw["cmdline"],
        )  # fmt: skip
        assert row.gpus == tuple(raw["gpus"]) and row.rss == raw["rss"]
        assert row.agent_record() == raw  # what a capture is given: the agent's record
    gpu = view.gpus[0]
    assert (gpu.index, gpu.util, gpu.mem_total) == (0, 97, sample["gpus"][0]["mem_total"])
    assert isinstance(gpu.util, int)  # printed as it came: `97%`, not `97.0%`


def test_records_of_the_wrong_shape_are_left_out_or_read_as_unknown() -> None:
    rows = process_rows([
        {"pid": "7"},  # no whole-number pid: no row
        {"rank": 0},
        "not a record",
        {"pid": 8, "rank": "0", "cpu_percent": True, "gpus": [0, "x", 2], "env": None},
    ])  # fmt: skip
    assert rows == (ProcessRow(pid=8, gpus=(0, 2)),)
    assert rows[0].rank is None and rows[0].cpu_percent is None and rows[0].env == {}
    assert process_rows(None) == () and gpu_rows({"index": 0}) == ()
    assert gpu_rows([{"index": 1, "util": "high"}, {"name": "no index"}]) == (GpuRow(index=1),)


def test_server_rows_read_the_health_answer() -> None:
    assert ServerRow.from_agent(None) is None and ServerRow.from_agent({}) is None
    unpolled = ServerRow.from_agent({"kind": "sglang", "url": "http://10.0.0.1:30000/health"})
    assert unpolled is not None and not unpolled.down
    assert server_text(unpolled) == "10.0.0.1:30000 health ?"
    health = {"ok": False, "error": "connection refused", "latency_ms": 2.4}
    down = ServerRow.from_agent({"url": "http://10.0.0.1:30000/health", "health": health})
    assert down is not None and down.down
    assert server_text(down) == "10.0.0.1:30000 down: connection refused 2ms"
    up = ServerRow.from_agent({"url": "http://h:1/health", "health": {"ok": True}})
    assert up is not None and not up.down and server_text(up) == "h:1 ok"
