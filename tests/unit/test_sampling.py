"""Sampling over time (`nodes --samples N --interval S`): a real process whose RSS grows
beside a steady twin, a rank that leaves between samples, and the series' arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.nodes import node_report
from areal_console.core.connection.sampling import SampleHistory, memory_growth
from areal_console.core.connection.transport import LocalChannel

from tests.conftest import run_cli

MB = 1 << 20
# A rank (RANK in its environment) that touches 10 MB more every second, up to 300 MB,
# or, with a growth of 0, holds 40 MB. It writes its ready file once it runs.
WORKER = """
import os, sys, time
grow, ready = int(sys.argv[1]), sys.argv[2]
held = [b"x" * (40 << 20)]
open(ready, "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
    if grow and len(held) < 300:
        held.append(b"y" * (grow << 20))
"""


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    started: dict[str, subprocess.Popen[bytes]] = {}
    for rank, (name, grow) in enumerate((("growing", 1), ("steady", 0))):
        ready = tmp_path / f"{name}.ready"
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(grow), str(ready)], env=env)
        started[name] = proc
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
    yield started
    for proc in started.values():
        proc.kill()
        proc.wait()


def test_nodes_samples_flags_the_growing_process_not_its_twin(
    ranks: dict[str, subprocess.Popen[bytes]],
) -> None:
    result = run_cli("nodes", "--local", "--samples", "4", "--interval", "1", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["samples"] == {"count": 4, "interval": 1.0}
    ours = {proc.pid for proc in ranks.values()}
    assert not [g for g in doc["gone"] if g["pid"] in ours]  # (other jobs on this machine may end)
    procs = {p["pid"]: p for n in doc["nodes"] for p in n["processes"]}
    growing, steady = procs[ranks["growing"].pid], procs[ranks["steady"].pid]
    assert len(growing["rss_series"]) == 4 and len(steady["rss_series"]) == 4
    rss = [r for _, r in growing["rss_series"]]
    assert rss == sorted(rss) and rss[-1] - rss[0] > 15 * MB
    [flag] = growing["flags"]
    assert flag["kind"] == "memory_growth"
    assert "MB/min over 4 samples" in flag["evidence"]
    assert (
        "issue 1209" in flag["remedy"] and f"py-spy dump --pid {growing['pid']}" in flag["remedy"]
    )
    assert "memray" in flag["remedy"] and "tracemalloc" in flag["remedy"]
    assert steady["flags"] == []
    text = run_cli("nodes", "--local", "--samples", "3", "--interval", "1")
    assert text.returncode == 0, text.stderr
    assert f"pid {growing['pid']}: RSS " in text.stdout and "memory_growth: RSS grew" in text.stdout


def test_nodes_without_samples_keeps_its_shape(ranks: dict[str, subprocess.Popen[bytes]]) -> None:
    result = run_cli("nodes", "--local", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "samples" not in doc and "gone" not in doc
    assert all("flags" not in p for n in doc["nodes"] for p in n["processes"])


def test_a_rank_gone_from_its_node_is_named_in_the_next_sample(
    ranks: dict[str, subprocess.Popen[bytes]],
) -> None:
    client = AgentClient(LocalChannel())
    client.start()
    history = SampleHistory()
    try:
        ours = {proc.pid for proc in ranks.values()}

        def add(node: dict[str, Any], at: float) -> list[Any]:  # other jobs here may end too
            return [g for g in history.add([node], at) if g.pid in ours]

        first = node_report("node0", "127.0.0.1", client.request("sample", {}))
        assert add(first, 1.0) == []
        steady = ranks["steady"]
        steady.kill()
        steady.wait()
        second = node_report("node0", "127.0.0.1", client.request("sample", {}))
        [gone] = add(second, 2.0)
        assert (gone.node, gone.pid, gone.rank, gone.last_seen) == ("node0", steady.pid, 1, 1.0)
        assert "rank 1" in gone.describe() and "gone since the last sample" in gone.describe()
        assert add(second, 3.0) == []  # named once
        # A node that did not answer says nothing about its ranks.
        down = {"name": "node0", "state": "down", "processes": []}
        assert history.add([down], 4.0) == []
    finally:
        client.close()


def test_memory_growth_needs_steady_growth_over_three_samples() -> None:
    minute = [(0.0, 100 * MB), (30.0, 130 * MB), (60.0, 160 * MB)]
    flag = memory_growth(minute, pid=7)
    assert flag is not None and "60 MB/min over 3 samples" in flag.evidence
    assert memory_growth(minute[:2], pid=7) is None  # two samples are not a trend
    slow = [(0.0, 100 * MB), (30.0, 110 * MB), (60.0, 120 * MB)]
    assert memory_growth(slow, pid=7) is None  # 20 MB/min
    jump = [(0.0, 100 * MB), (30.0, 100 * MB), (60.0, 100 * MB), (90.0, 300 * MB)]
    assert memory_growth(jump, pid=7) is None  # one jump, not steady growth
    saw = [(0.0, 100 * MB), (30.0, 200 * MB), (60.0, 100 * MB), (90.0, 200 * MB), (120.0, 100 * MB)]
    assert memory_growth(saw, pid=7) is None
    assert memory_growth([(5.0, MB), (5.0, 900 * MB), (5.0, 2000 * MB)], pid=7) is None


def test_a_reused_pid_starts_a_new_series() -> None:
    history = SampleHistory()
    node = lambda cmd, rss: {"name": "n", "state": "up",  # noqa: E731
                             "processes": [{"pid": 5, "cmdline": cmd, "rss": rss}]}  # fmt: skip
    history.add([node("a", 1)], 1.0)
    history.add([node("a", 2)], 2.0)
    history.add([node("b", 3)], 3.0)
    assert history.series("n", 5) == [(3.0, 3)]
    history.add([{"name": "n", "state": "up", "processes": []}], 4.0)
    assert history.series("n", 5) == []


def _sampled_standin(samples: int, **stub: str) -> tuple[int, str, str]:
    """The stand-in SGLang server (SGLang's /metrics bytes) started as AReaL starts its
    servers, `stub` its STUB_* settings; its pid, one `nodes --json` and one
    `nodes --samples N --interval 3.5 --json` (server polls are 3 s apart)."""
    from tests.support.cluster import free_port

    jobs = Path(__file__).parents[1] / "jobs"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(jobs / "areal_stub"), "STUB_HEALTH": "metrics",
           "STUB_TESTS_ROOT": str(jobs.parent.parent), **stub}  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "areal.v2.inference_service.sglang.launch_server",
         "--model-path", "stub-model", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
    )  # fmt: skip
    try:
        once = run_cli("nodes", "--local", "--json")
        assert once.returncode == 0, once.stderr
        result = run_cli("nodes", "--local", "--samples", str(samples), "--interval", "3.5",
                         "--json")  # fmt: skip
        assert result.returncode == 0, result.stderr
    finally:
        server.kill()
        server.wait()
    return server.pid, once.stdout, result.stdout


def _server_flags(doc: str, pid: int) -> list[dict[str, str]]:
    [proc] = [p for n in json.loads(doc)["nodes"] for p in n["processes"] if p["pid"] == pid]
    return list(proc["server"]["flags"])


def test_nodes_samples_raise_kv_saturated_on_a_server_whose_queue_grows() -> None:
    """KV cache 97% full, the queue 3 requests longer at every poll: one sample cannot tell
    a growing queue, three polls across the samples do."""
    pid, once, sampled = _sampled_standin(4, STUB_TOKEN_USAGE="0.97", STUB_QUEUE_GROWTH="3")
    assert _server_flags(once, pid) == []  # one poll: no history
    flags = _server_flags(sampled, pid)
    assert [f["kind"] for f in flags] == ["kv_saturated"], flags
    evidence = flags[0]["evidence"]
    assert evidence.startswith("KV cache 97% full, queue grew ") and "over 3 polls" in evidence


@pytest.mark.slow
def test_nodes_samples_raise_throughput_drop_after_enough_polls() -> None:
    """Throughput a tenth of its recent median after 6 polls, requests still running: the
    median needs 5 earlier polls, so only sampling over ~30 s raises it."""
    pid, once, sampled = _sampled_standin(10, STUB_THROUGHPUT_DROP_AFTER="6")
    assert _server_flags(once, pid) == []
    flags = _server_flags(sampled, pid)
    assert [f["kind"] for f in flags] == ["throughput_drop"], flags
    evidence = flags[0]["evidence"]  # the median mixes 1800 and 180: how many of each varies
    assert evidence.startswith("180 tokens/s, ") and "of the recent median" in evidence
    assert evidence.endswith("with 4 requests running or waiting")


def _h200_fleet(utils: dict[int, list[float]]) -> list[list[dict[str, Any]]]:
    """Samples of 2 nodes x 4 H200s, one rank per GPU, each GPU and rank as NVML read them
    on a real H200 node (tests/data/h200-nodes.json: a matmul loop holding 6 GiB, 100 %
    busy), with the utilisation of rank r in sample s set to `utils[r][s]` (NVML's
    idle reading is 0)."""
    real = json.loads((Path(__file__).parents[1] / "data" / "h200-nodes.json").read_text())
    gpu, proc = real["nodes"][0]["gpus"][0], real["nodes"][0]["processes"][0]
    samples = []
    for s in range(len(utils[0])):
        nodes = []
        for n in range(2):
            gpus, procs = [], []
            for i in range(4):
                rank = n * 4 + i
                gpus.append({**gpu, "index": i, "uuid": f"{gpu['uuid'][:-1]}{rank}",
                             "util": utils[rank][s]})  # fmt: skip
                procs.append({**proc, "pid": 1000 + rank, "rank": rank, "local_rank": i,
                              "world_size": 8, "gpus": [i]})  # fmt: skip
            nodes.append({"name": f"gpu{n}", "state": "up", "gpus": gpus, "processes": procs})
        samples.append(nodes)
    return samples


def test_a_rank_whose_gpu_idles_while_the_others_are_busy_is_named() -> None:
    busy = [100.0, 100.0, 98.0, 100.0]
    utils = {r: busy for r in range(8)}
    utils[5] = [0.0, 0.0, 3.0, 0.0]
    history = SampleHistory()
    for s, nodes in enumerate(_h200_fleet(utils)):
        history.add(nodes, float(s))
    ranks, idle = history.gpu_spread()
    assert [r.rank for r in ranks] == list(range(8))
    assert ranks[0].gpus == (0,) and ranks[0].memory == 7321157632 and ranks[0].util == 99.5
    [lazy] = idle
    assert (lazy.gpu.node, lazy.gpu.rank, lazy.gpu.gpus, lazy.gpu.samples) == ("gpu1", 5, (1,), 4)
    assert lazy.others_median == 99.5
    assert lazy.describe() == ("gpu1: rank 5 (pid 1005, GPU 1) is idle: 1% mean utilisation "
                               "over 4 samples while the other ranks' median is 100%")  # fmt: skip
    assert lazy.to_json()["evidence"] == lazy.describe()


def test_gpu_spread_names_no_one_when_all_vary_or_all_idle_or_too_few_samples() -> None:
    varied = {r: [60.0 + 5 * r, 100.0, 70.0] for r in range(8)}
    history = SampleHistory()
    for s, nodes in enumerate(_h200_fleet(varied)):
        history.add(nodes, float(s))
    assert history.gpu_spread()[1] == []
    quiet = {r: [0.0, 0.0, 0.0] for r in range(8)}  # all waiting together: not one rank
    history = SampleHistory()
    for s, nodes in enumerate(_h200_fleet(quiet)):
        history.add(nodes, float(s))
    assert history.gpu_spread()[1] == []
    short = {r: [100.0, 100.0] for r in range(8)} | {2: [0.0, 0.0]}
    history = SampleHistory()
    for s, nodes in enumerate(_h200_fleet(short)):
        history.add(nodes, float(s))
    assert history.gpu_spread()[1] == []  # two samples are not enough


def test_without_nvml_there_is_no_gpu_spread() -> None:
    history = SampleHistory()
    node = {"name": "cpu0", "state": "up", "gpus": [], "gpu_error": "NVML not available",
            "processes": [{"pid": 7, "rank": 0, "gpus": [], "rss": 1}]}  # fmt: skip
    for s in range(4):
        history.add([node], float(s))
    assert history.gpu_spread() == ([], [])


def test_nodes_text_after_samples_names_idle_gpus_and_gone_ranks() -> None:
    from areal_console.commands.nodes import render_sampled
    from areal_console.core.connection.sampling import GoneRank

    utils = {r: [100.0] * 3 for r in range(8)} | {6: [0.0] * 3}
    history = SampleHistory()
    for s, nodes in enumerate(_h200_fleet(utils)):
        history.add(nodes, float(s))
    gone = [GoneRank("gpu0", 1003, 3, "trainer", 1.0)]
    text = render_sampled(nodes, gone, history.gpu_spread()[1])
    assert "gone: gpu0: rank 3 (trainer), pid 1003, is gone since the last sample" in text
    assert "GPU idle: gpu1: rank 6 (pid 1006, GPU 2) is idle: 0% mean" in text


def _fleet_sample(s: int) -> list[dict[str, Any]]:
    """Sample `s` of 3 nodes x 4 processes as `nodes --json` lists them: on gpu0 pid 103
    grows 2 MiB a second, the others jitter by a page or two; on gpu1 pid 111 ends at
    sample 25 and pid 115 starts (a new layout); on gpu2 one reading at sample 30 is a
    float (its block stops standing for the series) and pid 121 shares its GPU with 120."""
    nodes = []
    for n in range(3):
        procs, gpus = [], []
        for i in range(4):
            pid = 100 + 10 * n + i
            if n == 1 and i == 1 and s >= 25:
                pid = 115
            grows = n == 0 and i == 3
            rss: float = 800 * MB + (s * 2 * MB if grows else ((s * (i + 1)) % 3) << 12)
            if n == 2 and i == 2 and s == 30:
                rss = float(rss)
            procs.append({"pid": pid, "cmdline": f"python -m trainer {pid}", "rss": rss,
                          "rank": 4 * n + i, "role": "trainer", "cpu_percent": 99.0,
                          "gpus": [0 if (n == 2 and i == 1) else i],
                          "gpu_memory": 7321157632})  # fmt: skip
            util = 0.0 if (n == 1 and i == 2) else 90.0 + (s * (i + 3)) % 10
            gpus.append({"index": i, "util": util if s != 12 or i != 0 else None})
        nodes.append({"name": f"gpu{n}", "state": "up", "gpus": gpus, "processes": procs})
    return nodes


def test_the_live_path_reaches_the_verdicts_of_the_plain_series() -> None:
    """The monitor's path (rows typed again only where more than the readings changed,
    readings kept side by side and the trends of a node's processes worked out together)
    against the same samples through `nodes --samples`' path and the plain arithmetic on
    each process's own series: the same series, sparklines, growth flags and idle ranks,
    across a new layout, a reading that is not an int and a missing GPU reading."""
    from areal_console.core.connection.monitor import sample_rows
    from areal_console.core.connection.sampling import (
        GROWTH_WINDOW,
        SPARKS,
        memory_trends,
    )

    live, plain = SampleHistory(), SampleHistory()
    rows: dict[str, Any] = {}
    fed: dict[tuple[str, int], list[tuple[float, int]]] = {}
    checked = 0
    for s in range(60):
        at = 1000.0 + s
        nodes = _fleet_sample(s)
        plain.add(nodes, at)
        for node in nodes:
            procs, gpus, _ = sample_rows(node, rows.get(node["name"], ()))
            rows[node["name"]] = procs
            live.add_rows(node["name"], procs, at)
            live.add_gpu_rows(node["name"], gpus, procs)
            for p in node["processes"]:
                if type(p["rss"]) is int and not (node["name"] == "gpu1" and p["pid"] == 111):
                    fed.setdefault((node["name"], p["pid"]), []).append((at, p["rss"]))
        if s % 5 != 4 or s < 10:
            continue
        trends = memory_trends(live)
        for key, trend in trends.items():
            series = live.series(*key)
            assert series == plain.series(*key)
            tail = [r for _, r in series[-8:]]
            lo, hi = min(tail), max(tail)
            spark = "".join(
                SPARKS[0] if hi == lo else SPARKS[round((r - lo) / (hi - lo) * 7)] for r in tail
            )
            assert trend.spark == spark, (key, s)
            growth = memory_growth(series[-GROWTH_WINDOW:], key[1])
            assert trend.growth == growth, (key, s)
            checked += 1
        assert trends == memory_trends(plain)
        assert live.idle_ranks() == plain.gpu_spread()[1] == live.gpu_spread()[1]
    # The steady processes' series hold every int reading they were given, in order.
    assert live.series("gpu0", 100) == fed[("gpu0", 100)]
    assert live.series("gpu1", 115) == fed[("gpu1", 115)]
    assert checked > 100
    growing = {k for k, t in memory_trends(live).items() if t.growth}
    assert growing == {("gpu0", 103)}
    [idle] = live.idle_ranks()
    assert (idle.gpu.node, idle.gpu.rank, idle.gpu.samples) == ("gpu1", 6, 60)
    first = {(r.node, r.rank): r.samples for r in live.gpu_spread()[0]}
    assert first[("gpu0", 0)] == 59  # GPU 0 gave no reading in sample 12


def test_a_record_is_typed_again_when_more_than_its_readings_changed() -> None:
    from areal_console.core.connection.records import ProcessRow, process_rows

    first = process_rows([{"pid": 5, "cmdline": "a", "rss": 1, "rank": 0, "gpus": [0]}])
    record = {"pid": 5, "cmdline": "a", "rss": 2, "rank": 0, "gpus": [0], "state": "S"}
    again = process_rows([record, {"pid": [1]}, {"pid": 6, "rss": True}], first)
    assert again == (ProcessRow.from_agent(record), ProcessRow.from_agent({"pid": 6, "rss": True}))
    assert again[0].raw == record and again[0].rss == 2 and again[0].state == "S"
    assert again[1].rss is None  # a bool is no reading
    same = {"pid": 5, "cmdline": "a", "rss": 3, "rank": 0, "gpus": [0]}
    [kept] = process_rows([same], first)
    assert kept == ProcessRow.from_agent(same) and kept.gpus is first[0].gpus  # not typed again
    moved = {"pid": 5, "cmdline": "a", "rss": 2, "rank": 1, "gpus": [0]}
    assert process_rows([moved], first)[0].rank == 1  # the rank changed: typed in full


def test_readings_an_agent_should_never_send_cost_no_verdict() -> None:
    """Ints that span more than an int64 (worked out side by side), and one past an int64
    (the node goes back to one series at a time): no crash, every sparkline drawn from the
    eight levels."""
    from areal_console.core.connection.sampling import SPARKS, memory_trends

    history = SampleHistory()
    for s in range(25):
        wide = [{"pid": 1, "cmdline": "a", "rss": (s % 3 - 1) * 2**62 + s}]
        past = [{"pid": 2, "cmdline": "b", "rss": 2**70 if s == 24 else 5}]
        history.add([{"name": "n", "state": "up", "processes": wide},
                     {"name": "m", "state": "up", "processes": past}], float(s))  # fmt: skip
    trends = memory_trends(history)
    assert set(trends) == {("n", 1), ("m", 2)}
    assert all(set(t.spark) <= set(SPARKS) and len(t.spark) == 8 for t in trends.values())
    assert history.series("m", 2)[-1] == (24.0, 2**70)
