"""Stacks where py-spy cannot attach, on one real hung 4-rank gloo job run by `nobody`
(tests/jobs/fr_ranks.py, mode `op`: rank 3 broadcasts while ranks 0-2 all_reduce).
Ranks 0-1 serve their stacks through the launch hook's socket; ranks 2-3 run without the
hook and start torch's debug server instead (a TCP port registered in the job's store).

The console runs as root without CAP_SYS_PTRACE (`capsh --drop=cap_sys_ptrace`): py-spy
is denied, and every rank's stack comes from its worker server, with the diagnosis a
control run with ptrace (py-spy) gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env

from tests.support.fixtures.fr_jobs import FrJob
from tests.support.nobody import needs_nobody, shared_tmp

pytestmark = [pytest.mark.slow, needs_nobody]
CAPSH = shutil.which("capsh")
DEBUG_SERVER = {"AREAL_FR": "0", "FR_DEBUG_SERVER": "1"}


@pytest.fixture(scope="module")
def nobody_job() -> Iterator[FrJob]:
    if CAPSH is None:
        pytest.skip("needs capsh (libcap2-bin) to drop CAP_SYS_PTRACE")
    # `nobody` writes its ready marks and sockets in the shared folder.
    with shared_tmp("areal-noptrace-") as workdir:
        job = FrJob("op", workdir, user="nobody", rank_env={2: DEBUG_SERVER, 3: DEBUG_SERVER})
        try:
            job.wait_ready()
            yield job
        finally:
            job.stop()


def stacks(job: FrJob, *args: str, ptrace: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "areal_console", "stacks", "--local", "--match",
            str(job.workdir), "--json", *args]  # fmt: skip
    if not ptrace:
        argv = [CAPSH or "capsh", "--drop=cap_sys_ptrace", "--", "-c", 'exec "$@"', "sh", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=cli_env(),
                          check=False)  # fmt: skip


def outline(doc: dict[str, Any]) -> tuple[Any, ...]:
    """What a diagnosis says and the groups it rests on, each frame by its place (py-spy
    names a function by its qualified name, faulthandler by its bare name)."""
    d = doc["diagnosis"]
    groups = [(g["label"], [(f["file"], f["line"]) for f in g["frames"]]) for g in doc["groups"]]
    return (d["pattern"], d["title"], groups)


def test_every_rank_from_its_worker_server_without_ptrace(nobody_job: FrJob) -> None:
    denied = stacks(nobody_job, ptrace=False)
    assert denied.returncode == 0, denied.stderr
    doc = json.loads(denied.stdout)
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r["state"] for r in ranks.values()} == {"ok"}
    assert {r["source"] for r in ranks.values()} == {"worker_server"}
    assert {r["pid"] for r in ranks.values()} == {p.pid for p in nobody_job.procs}
    assert doc["diagnosis"]["pattern"] == "collective_mismatch"
    assert [g["label"] for g in doc["groups"]] == ["0-2", "3"]
    # the ledger's live read of the hook's sockets works without ptrace too (SO_PEERCRED)
    assert sorted(doc["ledger"]["sources"]) == ["0", "1"]
    assert all(s.startswith("live:") for s in doc["ledger"]["sources"].values())

    control = stacks(nobody_job)  # root with ptrace: py-spy
    assert control.returncode == 0, control.stderr
    with_pyspy = json.loads(control.stdout)
    assert {r["source"] for r in with_pyspy["ranks"]} == {"py-spy"}
    assert outline(with_pyspy) == outline(doc)


def test_the_text_names_the_source(nobody_job: FrJob) -> None:
    argv = [sys.executable, "-m", "areal_console", "stacks", "--local", "--match",
            str(nobody_job.workdir), "--source", "worker"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=cli_env(),
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Stacks from worker server: ranks 0-3\n" in result.stdout


def test_pyspy_only_without_ptrace_says_why(nobody_job: FrJob) -> None:
    result = stacks(nobody_job, "--source", "py-spy", ptrace=False)
    assert result.returncode == 1
    assert "error: no rank captured: 4 ranks found, no stack dumped" in result.stderr
    assert f"rank 0: permission denied attaching to {nobody_job.procs[0].pid}" in result.stderr
    assert "give the container SYS_PTRACE" in result.stderr


def test_a_rank_holding_the_gil_is_cut_and_named(tmp_path: Path) -> None:
    """A real rank with the hook whose main thread holds the GIL in one long C call: its
    worker server cannot run Python, so it is cut at the per-rank deadline, named."""
    from areal_node.agent.worker_server import worker_stacks
    from areal_node.fr_hook import HOOK_DIR

    env = {
        **os.environ,
        "RANK": "0",
        "PYTHONPATH": str(HOOK_DIR),
        "AREAL_FR_SOCKET_DIR": str(tmp_path),
    }
    script = (
        "import sys, torch; print('ready', flush=True); "
        "sum(range(10**14))"  # one C call: the GIL is never released
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        got = worker_stacks(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not got["ok"] and got["reason"] == "timeout"
    assert got["error"].endswith(
        "gave no stack within 3s (its GIL is held: a thread in a long C call?)"
    )


def test_the_agent_op_reports_progress_from_worker_servers(nobody_job: FrJob) -> None:
    """`pyspy` with `source: worker` over the agent protocol (a real agent process): one
    `pyspy_progress` event per rank, each dump `source: worker_server` with the endpoint."""
    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import LocalChannel

    client = AgentClient(LocalChannel())
    client.start()
    events: list[dict[str, Any]] = []
    client.on_event = events.append
    try:
        pids = [p.pid for p in nobody_job.procs]
        args = {"pids": pids, "source": "worker", "progress": "w1"}
        reply = client.request("pyspy", args, timeout=60)
    finally:
        client.close()
    dumps = {d["pid"]: d for d in reply["dumps"]}
    assert all(dumps[p]["ok"] and dumps[p]["source"] == "worker_server" for p in pids)
    assert [dumps[p]["endpoint"].endswith(f"areal-fr-{p}.sock") for p in pids] == [
        True, True, False, False,
    ]  # fmt: skip
    assert all(dumps[p]["endpoint"].split(":")[-1].isdigit() for p in pids[2:])  # debug server
    progress = [e for e in events if e["event"] == "pyspy_progress"]
    assert sorted(e["done"] for e in progress) == [1, 2, 3, 4]
    assert {e["pid"] for e in progress} == set(pids) and all(e["total"] == 4 for e in progress)
