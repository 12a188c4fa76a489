"""The collective ledger on real hung 4-rank gloo jobs started with the recorder hook on
PYTHONPATH (tests/jobs/fr_ranks.py): read live from each rank's worker-server socket, and
from the dump file a crashed rank wrote, through the local agent; shown by `stacks`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.fleet import Fleet
from areal_console.core.ledger import build_ledger, parse_trace
from areal_console.core.stacks.capture import CaptureOptions, take_capture
from areal_console.core.targets.resolve import NodeSpec
from areal_node.agent.flight_recorder import FR_ENV, fr_live
from areal_node.agent.procfs import parse_environ
from conftest import run_cli, wait_for

from tests.support.cluster import free_port
from tests.support.fixtures.fr_jobs import FrJob

pytestmark = pytest.mark.slow

MODES = ("op", "size", "behind", "died", "crashed")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FrJob]]:
    """One hung job per scenario, all started at once; killed at the end."""
    started: dict[str, FrJob] = {}
    try:
        for mode in MODES:
            started[mode] = FrJob(mode, tmp_path_factory.mktemp(f"fr-{mode}"))
        for job in started.values():
            job.wait_ready()
        yield started
    finally:
        for job in started.values():
            job.stop()


def ledger_doc(job: FrJob, done: Any) -> dict[str, Any]:
    """`stacks --json` of the job's ledger, retaken until `done(ledger)` (the ready mark
    is written just before the last collective is enqueued)."""
    found: dict[str, Any] = {}

    def settled() -> bool:
        fleet = Fleet([NodeSpec(name="node0")])
        try:
            capture = take_capture(fleet, CaptureOptions(match=str(job.workdir)), save=False)
        finally:
            fleet.close()
        ledger = capture.ledger.to_json() if capture.ledger else None
        found["ledger"] = ledger
        return ledger is not None and bool(done(ledger))

    wait_for(settled, timeout=60, interval=0.5, what=f"the {job.mode} job's ledger")
    return found["ledger"]


def group(ledger: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in ledger["groups"] if g["name"] == name)


def test_op_mismatch_live_through_the_cli(jobs: dict[str, FrJob]) -> None:
    job = jobs["op"]
    ledger_doc(job, lambda lg: group(lg, "0")["mismatch"])
    result = run_cli("stacks", "--match", str(job.workdir), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    g = group(doc["ledger"], "0")
    assert g["mismatch"]["seq"] == 4 and g["mismatch"]["kind"] == "op"
    assert g["summary"] == "ranks 0-2 all_reduce #4 [8] float32 · rank 3 broadcast #4 [8] float32"
    assert all(
        "/areal-fr-" in s and s.startswith("live:") for s in doc["ledger"]["sources"].values()
    )
    assert doc["diagnosis"]["title"] == "Ranks disagree at collective #4 of group 0 (default_pg)"
    text = run_cli("stacks", "--open", doc["id"])
    assert "Collective ledger (Flight Recorder):" in text.stdout
    assert "group 0 (default_pg), ranks 0-3: ranks 0-2 all_reduce #4 [8] float32" in text.stdout
    assert "group 1 (grads)" not in text.stdout  # created, never used


def test_size_mismatch_live(jobs: dict[str, FrJob]) -> None:
    lg = ledger_doc(jobs["size"], lambda lg: group(lg, "0")["mismatch"])
    g = group(lg, "0")
    assert (g["mismatch"]["seq"], g["mismatch"]["kind"]) == (4, "sizes")
    assert [v["ranks"] for v in g["mismatch"]["variants"]] == [[0, 1, 3], [2]]
    assert g["summary"] == "rank 2 barrier #5 · ranks 0-1,3 all_reduce #4 [8] float32"


def test_one_rank_one_call_behind_live(jobs: dict[str, FrJob]) -> None:
    lg = ledger_doc(jobs["behind"], lambda lg: group(lg, "0")["behind"] == {"1": 1})
    g = group(lg, "0")
    assert g["mismatch"] is None and g["absent"] == []
    assert (
        g["summary"] == "ranks 0,2-3 all_reduce #4 [8] float32 · rank 1 all_reduce #3 [8] float32"
    )
    assert group(lg, "1")["summary"] == "rank 1 barrier #1 · ranks 0,2-3 no collective"


def test_dead_rank_is_absent_live(jobs: dict[str, FrJob]) -> None:
    lg = ledger_doc(jobs["died"], lambda lg: group(lg, "0")["positions"])
    g = group(lg, "0")
    assert g["absent"] == [3] and g["behind"] == {} and g["mismatch"] is None
    assert sorted(lg["sources"]) == ["0", "1", "2"]
    assert "group 0 (default_pg): no trace from rank 3" in lg["findings"]


def test_crashed_rank_read_from_its_dump_file(jobs: dict[str, FrJob]) -> None:
    """The crashed rank wrote `${TORCH_FR_DUMP_TEMP_FILE}3`; the agent found the prefix in
    the survivors' environment and decoded the file; the survivors answered live."""
    job = jobs["crashed"]
    wait_for(lambda: (job.dump_dir / "rank_3").exists(), timeout=30, what="rank 3's dump")
    lg = ledger_doc(job, lambda lg: "3" in lg["sources"])
    assert lg["sources"]["3"] == f"file:{job.dump_dir / 'rank_3'}"
    assert all(lg["sources"][str(r)].startswith("live:") for r in range(3))
    g = group(lg, "0")
    assert g["behind"] == {"3": 1} and g["absent"] == []
    assert g["summary"] == "ranks 0-2 all_reduce #4 [8] float32 · rank 3 all_reduce #3 [8] float32"


def test_job_without_recorder_falls_back_to_stacks(gloo_job: Any, tmp_path: Path) -> None:
    """A job started without the hook: stacks as before, the ledger says once why not."""
    result = run_cli("stacks", "--match", str(gloo_job.workdir))
    assert result.returncode == 0, result.stderr
    lines = [ln for ln in result.stdout.splitlines() if "Collective ledger" in ln]
    assert lines == [
        "Collective ledger: no Flight Recorder trace from any rank: stacks only "
        "(start the job with the recorder hook on PYTHONPATH, see docs/guide/ledger.md)"
    ]


WORKER_MAIN_RANK = """
import os, time, torch, torch.distributed as dist
from torch.distributed.elastic.control_plane import worker_main

with worker_main():
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
    open(os.environ["READY"], "w").close()
    time.sleep(3600)
"""


def test_job_serving_torch_worker_main_is_read_live(tmp_path: Path) -> None:
    """No hook: a job wrapped in torch's `worker_main()` with TORCH_WORKER_SERVER_SOCKET set
    and the recorder on; the agent reads torch's own `fr_trace_json` from that socket."""
    ready = tmp_path / "ready"
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "TORCH_FR_BUFFER_SIZE": "100",
        "TORCH_WORKER_SERVER_SOCKET": str(tmp_path / "worker.sock"),
        "READY": str(ready),
    }
    proc = subprocess.Popen([sys.executable, "-c", WORKER_MAIN_RANK], env=env)
    try:
        wait_for(ready.exists, timeout=120, what="the rank")
        rank_env = parse_environ(Path(f"/proc/{proc.pid}/environ").read_bytes(), FR_ENV)
        reply = fr_live(proc.pid, rank_env, timeout=5.0)
        assert reply["ok"], reply
        assert reply["socket"] == str(tmp_path / "worker.sock")
        trace = parse_trace(0, "node0", "live", reply["socket"], reply["trace"])
        g = build_ledger([trace], world_size=1).group("0")
        assert g is not None and g.members == (0,)
        assert g.summary() == "rank 0 broadcast #2 [2] int64"
    finally:
        proc.kill()
        proc.wait(timeout=30)


# --------------------------------------------------------------------------------------
# Who waits for whom across groups: the wait-for graph on real hung jobs.

WAIT_MODES = {"wrong_group": 4, "three_groups": 4, "chain": 6}


@pytest.fixture(scope="module")
def wait_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FrJob]]:
    """One hung job per wait-for scenario, all started at once; killed at the end."""
    started: dict[str, FrJob] = {}
    try:
        for mode, nproc in WAIT_MODES.items():
            started[mode] = FrJob(mode, tmp_path_factory.mktemp(f"wf-{mode}"), nproc=nproc)
        for job in started.values():
            job.wait_ready()
        yield started
    finally:
        for job in started.values():
            job.stop()


def stacks_doc(job: FrJob, done: Any) -> dict[str, Any]:
    """`stacks --json` of the job once its ledger satisfies `done` (see `ledger_doc`)."""
    ledger_doc(job, done)
    result = run_cli("stacks", "--match", str(job.workdir), "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


NETWORK_ADVICE = ("NCCL_DEBUG", "network", "NCCL_SOCKET_IFNAME")


def no_network_advice(diagnosis: dict[str, Any]) -> bool:
    text = " ".join([diagnosis["detail"], *diagnosis["suggestions"]])
    return not any(word in text for word in NETWORK_ADVICE)


def test_wrong_group_is_a_cross_group_deadlock(wait_jobs: dict[str, FrJob]) -> None:
    """Every rank at the same all_reduce line; rank 3 passed the tp group [2, 3]. The
    stacks alone say `same_collective` (check the network); the ledger proves a cycle."""
    job = wait_jobs["wrong_group"]
    doc = stacks_doc(job, lambda lg: group(lg, "0")["behind"] == {"3": 1})
    tp = next(g for g in doc["ledger"]["groups"] if g["members"] == [2, 3])
    wf = doc["ledger"]["wait_for"]
    assert wf["cycles"] == [
        {"ranks": [2, 3], "groups": ["0", tp["name"]], "seqs": [4, 1],
         "ops": ["all_reduce", "all_reduce"]}
    ]  # fmt: skip
    assert wf["roots"] == [] and wf["edges_left_off"] == 0
    assert sorted((e["rank"], e["waits_for"], e["group"], e["seq"]) for e in wf["edges"]) == [
        (0, 3, "0", 4), (1, 3, "0", 4), (2, 3, "0", 4), (3, 2, tp["name"], 1)
    ]  # fmt: skip
    d = doc["diagnosis"]
    assert d["pattern"] == "cross_group_deadlock"
    assert d["title"] == (
        f"Cross-group deadlock: ranks 2-3 wait on each other across groups 0, {tp['name']}"
    )
    assert d["detail"].startswith(
        "Rank 2 waits in all_reduce #4 of group 0 (default_pg) for rank 3, rank 3 waits in "
        f"all_reduce #1 of group {tp['name']} for rank 2."
    )
    assert "Ranks 0-1 wait on the cycle." in d["detail"]
    assert no_network_advice(d)
    assert len(doc["groups"]) == 1  # the stacks cannot tell: one line for every rank
    text = run_cli("stacks", "--open", doc["id"]).stdout
    assert "DIAGNOSIS [cross_group_deadlock]" in text
    assert "Who waits for whom (from the ledger):" in text
    assert "  ranks 0-2 wait in all_reduce #4 of group 0 (default_pg) for rank 3" in text


def test_three_group_cycle(wait_jobs: dict[str, FrJob]) -> None:
    doc = stacks_doc(wait_jobs["three_groups"], lambda lg: group(lg, "0")["behind"])
    names = {tuple(g["members"]): g["name"] for g in doc["ledger"]["groups"]}
    wf = doc["ledger"]["wait_for"]
    assert wf["cycles"] == [
        {"ranks": [0, 1, 2], "groups": [names[(0, 1)], names[(1, 2)], names[(0, 2)]],
         "seqs": [1, 1, 1], "ops": ["all_reduce"] * 3}
    ]  # fmt: skip
    assert {(e["rank"], e["waits_for"]) for e in wf["edges"] if e["group"] == "0"} == {
        (3, 0),
        (3, 1),
        (3, 2),
    }
    d = doc["diagnosis"]
    assert d["pattern"] == "cross_group_deadlock"
    assert d["title"].startswith("Cross-group deadlock: ranks 0-2 wait on each other")
    assert "Rank 3 waits on the cycle." in d["detail"]
    assert no_network_advice(d)


def test_chain_ends_at_the_sleeping_rank(wait_jobs: dict[str, FrJob]) -> None:
    """Rank i waits on the pair [i, i+1] for rank i+1; rank 5 sleeps: the root."""
    doc = stacks_doc(wait_jobs["chain"], lambda lg: len(lg["groups"]) >= 6 and any(
        g["behind"] for g in lg["groups"] if g["members"] == [3, 4]))  # fmt: skip
    wf = doc["ledger"]["wait_for"]
    assert wf["cycles"] == []
    assert sorted((e["rank"], e["waits_for"]) for e in wf["edges"]) == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
        (4, 5),
    ]
    [root] = wf["roots"]
    assert root["rank"] == 5 and root["why"].startswith("outside any collective: main (")
    assert "fr_ranks.py" in root["why"]
    d = doc["diagnosis"]
    assert d["pattern"] == "same_collective"  # the existing pattern, naming the root
    assert d["title"].startswith(
        "Ranks 0-4 wait, directly or through each other, on rank 5 (outside any collective"
    )
    assert no_network_advice(d)
    assert d["suggestions"][0].startswith("Look at what rank 5 is doing: outside any collective")


def test_patterns_agree_where_no_cycle(jobs: dict[str, FrJob]) -> None:
    """Mismatches and a dead rank keep their patterns; the graph names who waits on whom."""
    op = stacks_doc(jobs["op"], lambda lg: group(lg, "0")["mismatch"])
    assert op["diagnosis"]["pattern"] == "collective_mismatch"
    assert op["ledger"]["wait_for"] == {"edges": [], "edges_left_off": 0, "cycles": [],
                                        "roots": []}  # fmt: skip
    size = stacks_doc(jobs["size"], lambda lg: group(lg, "0")["mismatch"])
    assert size["diagnosis"]["pattern"] == "collective_mismatch"
    wf = size["ledger"]["wait_for"]
    assert wf["cycles"] == [] and [r["rank"] for r in wf["roots"]] == [0, 1, 3]
    assert {(e["rank"], e["waits_for"], e["op"]) for e in wf["edges"]} == {
        (2, 0, "barrier"),
        (2, 1, "barrier"),
        (2, 3, "barrier"),
    }
    died = stacks_doc(jobs["died"], lambda lg: group(lg, "0")["positions"])
    assert died["diagnosis"]["pattern"] == "missing_ranks"
    assert died["ledger"]["wait_for"]["roots"] == [
        {"rank": 3, "why": "dead: no process shows rank 3"}
    ]
    assert "Every wait ends at rank 3: dead" in died["diagnosis"]["detail"]
    job = jobs["crashed"]
    wait_for(lambda: (job.dump_dir / "rank_3").exists(), timeout=30, what="rank 3's dump")
    crashed = stacks_doc(job, lambda lg: "3" in lg["sources"])
    assert crashed["diagnosis"]["pattern"] == "missing_ranks"
    [root] = crashed["ledger"]["wait_for"]["roots"]
    assert root == {
        "rank": 3,
        "why": "dead: no process shows rank 3; its trace ends at all_reduce #3 of group 0 "
        "(default_pg) (trace read from its dump file)",
    }
