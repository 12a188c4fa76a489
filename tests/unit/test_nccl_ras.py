"""NCCL RAS, read through the agent from a stand-in that speaks NCCL's RAS line protocol
and writes its reports as NCCL 2.28.7's code does (tests/jobs/standin_nccl_ras.py; no
GPU here): JSON and text parsed into the same counts, the lagging rank named, bounds
held against garbage, huge, slow and silent ports; a capture shows it beside the ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.core.stacks.nccl_ras import (
    RasStatus,
    parse_ras_json,
    parse_ras_text,
    ras_from_agent,
)
from areal_console.core.stacks.report import with_ras
from areal_node.agent.nccl_ras import op_nccl_ras
from conftest import cli_env

from tests.support.cluster import free_port
from tests.support.waits import wait_for

STANDIN = Path(__file__).resolve().parents[1] / "jobs" / "standin_nccl_ras.py"
sys.path.insert(0, str(STANDIN.parent))
import standin_nccl_ras  # noqa: E402


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="areal-ras-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Ranks:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, mode: str) -> int:
        port = free_port()
        env = {"RANK": "0", "WORLD_SIZE": "1", "NCCL_RAS_ADDR": f"127.0.0.1:{port}"}
        argv = [
            sys.executable,
            str(STANDIN),
            mode,
            str(self.workdir),
            f"areal-ras-{self.workdir.name}",
        ]
        proc = subprocess.Popen(argv, env=env)
        self.procs.append(proc)
        wait_for(lambda: (self.workdir / f"ready-{proc.pid}").exists(), timeout=30,
                 what="the RAS stand-in to listen")  # fmt: skip
        return proc.pid


@pytest.fixture
def ranks(workdir: Path) -> Iterator[Ranks]:
    r = Ranks(workdir)
    yield r
    for p in r.procs:
        p.kill()
        p.wait(timeout=30)


def ask(pid: int, timeout: float = 5.0) -> dict[str, Any]:
    return op_nccl_ras(cast(Any, None), {"pids": [pid], "timeout": timeout})


def test_json_report_through_the_agent(ranks: Ranks) -> None:
    reply = ask(ranks.start("json"))
    assert reply["ok"] and reply["format"] == "json" and reply["server_protocol"] == "2"
    status = ras_from_agent(reply)
    assert status.error is None and status.nccl_version == "2.28.7"
    big, small = status.comms
    assert (big.hash, big.size, small.missing, small.dead) == ("0x5a1e3c2b9d4f6071", 4, [1], [1])
    assert [(g.count, g.ranks) for g in big.counts["AllReduce"]] == [(11, [3]), (12, [0, 1, 2])]
    assert status.lagging_ranks() == [3]
    assert status.findings() == [
        "comm 0x5a1e3c2b9d4f6071: rank 3 launched AllReduce up to #11, others up to #12: "
        "they wait on rank 3"
    ]
    assert status.lines() == [
        "  comm 0x5a1e3c2b9d4f6071 (4 ranks): AllReduce: ranks 0-2 up to #12, rank 3 up to #11",
        "  comm 0x1b2c3d4e5f607182 (2 ranks): no data from ranks 1; considered dead: ranks 1",
    ]
    assert RasStatus.from_json(json.loads(json.dumps(status.to_json()))) == status


def test_text_report_of_an_older_nccl_gives_the_same_lag(ranks: Ranks) -> None:
    reply = ask(ranks.start("text"))
    assert reply["ok"] and reply["format"] == "text"
    status = ras_from_agent(reply)
    assert status.nccl_version == "2.26.6"
    (comm,) = status.comms
    assert comm.hash == "0x5a1e3c2b9d4f6071"
    assert [(g.count, g.size, g.ranks) for g in comm.counts["AllReduce"]] == [
        (12, 3, [0, 1, 2]), (11, 1, [3]),
    ]  # fmt: skip
    assert status.lagging_ranks() == [3]


def test_the_2_28_7_missing_comma_is_repaired_and_only_it() -> None:
    text = standin_nccl_ras.json_report()
    with pytest.raises(ValueError):
        json.loads(text)  # as NCCL 2.28.7 writes it
    assert parse_ras_json(text).comms[1].missing == [1]
    with pytest.raises(ValueError, match="not a RAS JSON report"):
        parse_ras_json('{"communicators": [}')
    with pytest.raises(ValueError, match="no communicators"):
        parse_ras_json("[1, 2]")


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("garbage", "not a RAS answer"),
        ("huge", "a report over 8388608 bytes: not read"),
        ("trickle", "no complete answer within 2s"),
        ("silent", "no complete answer within 2s"),
    ],
)
def test_a_bad_ras_port_is_bounded(ranks: Ranks, mode: str, says: str) -> None:
    pid = ranks.start(mode)
    began = time.monotonic()
    reply = ask(pid, timeout=2.0)
    took = time.monotonic() - began
    assert not reply["ok"] and says in reply["error"]
    assert reply["address"].startswith("127.0.0.1:")
    assert took < 20  # the 2 s deadline holds (a wide bound: a shared machine)
    assert ras_from_agent(reply).error == reply["error"]


def test_a_process_without_nccl_is_not_asked() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={"RANK": "0", "NCCL_RAS_ADDR": f"127.0.0.1:{free_port()}"})  # fmt: skip
    try:
        reply = ask(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not reply["ok"] and "address" not in reply
    assert (
        reply["error"]
        == f"no NCCL RAS port: no NCCL library in the rank's process (pid {proc.pid})"
    )


def test_the_lagging_rank_leads_a_same_collective_diagnosis() -> None:
    status = parse_ras_text(standin_nccl_ras.text_report())
    plain = Diagnosis("same_collective", "All 4 ranks wait in all_reduce", "detail")
    found = with_ras(plain, status)
    assert found.title == (
        "All 4 ranks wait in all_reduce; NCCL RAS: the others wait on rank 3 "
        "(its collective count lags)"
    )
    assert found.evidence[0].startswith("NCCL RAS: comm 0x5a1e3c2b9d4f6071: rank 3 launched")
    mismatch = Diagnosis("collective_mismatch", "Collective mismatch", "detail")
    assert with_ras(mismatch, status).title == "Collective mismatch"  # the stacks say more
    assert with_ras(plain, RasStatus(error="no answer")) == plain


def test_a_capture_shows_ras_beside_the_ledger(ranks: Ranks, workdir: Path) -> None:
    pid = ranks.start("json")
    argv = [sys.executable, "-m", "areal_console", "stacks", "--local", "--match",
            f"areal-ras-{workdir.name}", "--json"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=cli_env(),
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["pid"] for r in doc["ranks"]] == [pid]
    assert doc["nccl_ras"]["lagging_ranks"] == [3]
    assert doc["nccl_ras"]["address"].startswith("127.0.0.1:")
    assert any(
        e.startswith("NCCL RAS: comm 0x5a1e3c2b9d4f6071") for e in doc["diagnosis"]["evidence"]
    )
    text = subprocess.run(argv[:-1], capture_output=True, text=True, timeout=120, env=cli_env(),
                          check=False).stdout  # fmt: skip
    assert "\nNCCL RAS (127.0.0.1:" in text and ", NCCL 2.28.7):\n" in text
    assert (
        "  comm 0x5a1e3c2b9d4f6071 (4 ranks): AllReduce: ranks 0-2 up to #12, rank 3 up to #11\n"
        in text
    )
