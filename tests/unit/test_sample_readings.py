"""A sample stream's readings-only form (agent/readings.py) and the console's use of it
(records.with_readings, the Cluster screen's monitor): whole first, readings while nothing
else changes, whole again on any other change; the console's rows are the same as if
every sample had come whole."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from areal_console.core.connection.monitor import FleetMonitor, sample_rows
from areal_console.core.connection.records import with_readings
from areal_node.agent.readings import WHOLE_EVERY, DeltaStream
from conftest import wait_for


def sample(second: int, extra: bool = False) -> dict[str, Any]:
    procs = [
        {"pid": 100 + i, "ppid": 1, "cmdline": f"python train.py r{i}", "rank": i,
         "local_rank": i, "world_size": 2, "role": "trainer", "job": None, "server": None,
         "cpu_percent": 90.0 + second, "rss": 1000 * (i + 1) + second, "state": "R",
         "gpus": [i], "gpu_memory": 7 << 30, "env": {"RANK": str(i)}, "env_error": None}
        for i in range(3 if extra else 2)
    ]  # fmt: skip
    gpus = [
        {"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "util": 50 + second,
         "mem_used": 8 << 30, "mem_total": 141 << 30, "temp": 40 + i, "power": 600.5}
        for i in range(2)
    ]  # fmt: skip
    return {"time": float(second), "hostname": "gpu0", "gpus": gpus, "gpu_error": None,
            "processes": procs}  # fmt: skip


def test_the_stream_sends_whole_then_readings_then_whole_on_any_other_change() -> None:
    stream = DeltaStream()
    first = stream.event(sample(0))
    assert first == {"data": sample(0)}
    second = stream.event(sample(1))
    assert second == {"readings": {
        "time": 1.0,
        "processes": [[91.0, 1001, "R", 7 << 30], [91.0, 2001, "R", 7 << 30]],
        "gpus": [[51, 8 << 30, 40, 600.5], [51, 8 << 30, 41, 600.5]],
    }}  # fmt: skip
    assert len(json.dumps(second)) < len(json.dumps(first)) / 3
    assert "data" in stream.event(sample(2, extra=True))  # a new process
    renamed = sample(3, extra=True)
    renamed["processes"][0]["cmdline"] += " --resume"
    assert "data" in stream.event(renamed)  # any field but a reading
    assert "readings" in stream.event(renamed)
    # At least every WHOLE_EVERY samples whole, whatever the layout.
    kinds = [next(iter(stream.event(renamed))) for _ in range(WHOLE_EVERY)]
    assert kinds.count("data") == 1


def test_readings_give_the_rows_a_whole_sample_gives() -> None:
    procs, gpus, _ = sample_rows(sample(0))
    stream = DeltaStream()
    stream.event(sample(0))
    readings = stream.event(sample(5))["readings"]
    fitted = with_readings(procs, gpus, json.loads(json.dumps(readings)))
    assert fitted is not None
    whole_procs, whole_gpus, _ = sample_rows(sample(5))
    assert fitted == (whole_procs, whole_gpus)
    # Captures take agent records: they carry the newer readings.
    assert [p.agent_record()["rss"] for p in fitted[0]] == [1005, 2005]
    assert [p.agent_record()["cpu_percent"] for p in fitted[0]] == [95.0, 95.0]


def test_readings_that_do_not_fit_the_rows_are_refused() -> None:
    procs, gpus, _ = sample_rows(sample(0))
    good = DeltaStream()
    good.event(sample(0))
    readings = good.event(sample(1))["readings"]
    for bad in (
        None,
        [],
        {**readings, "processes": readings["processes"][:1]},  # another count
        {**readings, "gpus": "x"},
        {**readings, "processes": [[1, 2, 3], [1, 2, 3]]},  # not four values
        {**readings, "processes": [{"rss": 1}, {"rss": 2}]},
    ):
        assert with_readings(procs, gpus, bad) is None, bad
    # A value of the wrong type is dropped as in a whole sample, not taken.
    odd = {**readings, "processes": [["x", True, 7, None], readings["processes"][1]]}
    fitted = with_readings(procs, gpus, odd)
    assert fitted is not None
    row = fitted[0][0]
    assert (row.cpu_percent, row.rss, row.state, row.gpu_memory) == (None, None, "7", None)


def test_the_monitor_follows_a_real_agents_readings_and_its_new_processes() -> None:
    """This machine's agent streams at 0.2 s: a rank whose RSS grows is seen growing
    through readings-only samples, and a rank started meanwhile appears (a whole one)."""
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.targets.resolve import local_node

    grow = ("import os, time\nblocks = []\nwhile True:\n"
            "    blocks.append(bytearray(4 << 20))\n    time.sleep(0.2)\n")  # fmt: skip
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "PATH": "/usr/bin:/bin"}
    growing = subprocess.Popen([sys.executable, "-c", grow], env=env)
    later: subprocess.Popen[bytes] | None = None
    fleet = Fleet([local_node()])
    monitor = FleetMonitor(fleet, interval=0.2)
    kinds: list[str] = []
    take_readings, take_whole = monitor._on_readings, monitor._on_sample

    def count_readings(*args: Any) -> None:
        kinds.append("readings")
        take_readings(*args)

    def count_whole(*args: Any) -> None:
        kinds.append("whole")
        take_whole(*args)

    monitor._on_readings = count_readings  # type: ignore[method-assign]
    monitor._on_sample = count_whole  # type: ignore[method-assign]
    monitor.start()
    try:

        def rss_of(pid: int) -> float | None:
            [view] = monitor.snapshot()
            rows = [p for p in view.processes if p.pid == pid]
            return rows[0].rss if rows else None

        first = wait_for(lambda: rss_of(growing.pid), 30, "the growing rank")
        wait_for(lambda: kinds.count("readings") >= 3, 30, "readings-only samples")
        wait_for(lambda: (rss_of(growing.pid) or 0) > first + (8 << 20), 30, "RSS growth")
        env1 = {**env, "RANK": "1", "LOCAL_RANK": "1"}
        later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env1)
        wholes = kinds.count("whole")
        wait_for(lambda: rss_of(later.pid) is not None, 30, "the rank started later")
        assert kinds.count("whole") > wholes
    finally:
        monitor.stop()
        fleet.close()
        for proc in (growing, later):
            if proc is not None:
                proc.kill()
                proc.wait()
