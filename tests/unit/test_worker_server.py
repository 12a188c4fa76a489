"""Stacks from a rank's worker server: torch's `dump_traceback` text parsed into py-spy's
records (recorded real answers), and the reader's bounds against stand-in servers that
answer garbage, hugely, slowly or never, and one planted by another process; the job's
TCPStore read against a real one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.stacks.parsing import parse_pyspy_threads
from areal_node.agent.flight_recorder import _post as fr_post
from areal_node.agent.worker_server import (
    HANDLER,
    MAX_DEADLINE,
    WorkerServerError,
    parse_traceback,
    post,
    store_get,
    worker_stacks,
)

from tests.support.nobody import NOBODY, needs_nobody, shared_tmp
from tests.support.waits import wait_for

DATA = Path(__file__).resolve().parents[1] / "data" / "worker_server"
STANDIN = Path(__file__).resolve().parents[1] / "jobs" / "standin_worker_server.py"
CAPSH = shutil.which("capsh")
SYSTEM_PYTHON = "/usr/bin/python3"


def test_parse_a_real_answer_of_a_multithreaded_process() -> None:
    threads = parse_traceback((DATA / "dump_traceback_threads.txt").read_text())
    # the server's own thread (<no Python frame>) is dropped; the main thread is listed last
    assert [t["thread_name"] for t in threads] == ["Thread 0x00007fe25f73d6c0", "MainThread"]
    worker, main = threads
    assert [(f["name"], f["line"]) for f in worker["frames"]] == [
        ("worker", 6), ("run", 982), ("_bootstrap_inner", 1045), ("_bootstrap", 1002),
    ]  # fmt: skip
    assert main["frames"] == [
        {"name": "<module>", "filename": "/tmp/run/ws.py", "short_filename": "ws.py",
         "line": 9}
    ]  # fmt: skip
    assert worker["thread_id"] == 0x00007FE25F73D6C0


def test_parsed_threads_become_the_same_records_as_pyspy() -> None:
    raw = parse_traceback((DATA / "dump_traceback_gloo_rank0.txt").read_text())
    (main,) = parse_pyspy_threads(raw, pid=4242)
    assert main.is_main and not main.idle and main.distributed
    assert [f.function for f in main.frames] == ["all_reduce", "wrapper", "main", "<module>"]
    assert main.frames[2].location.endswith("tests/jobs/fr_ranks.py:84")


def test_parse_skips_what_is_not_a_stack_and_caps_sizes() -> None:
    text = "\n".join(
        [
            "garbage \x00\x1b[31m",
            "Thread 0xzz (most recent call first):",
            '  File "a.py", line 3 in f',
            '  File "weird", line ", line 7 in g',  # the last `", line ` splits
            '  File "no line number"',
            '  File "b.py", line ??? in h',
            "  ...",
            "Thread 0x2 (most recent call first):",
            *['  File "c.py", line 1 in deep'] * 1000,
        ]
    )
    threads = parse_traceback(text)
    assert threads[0]["thread_id"] == 0
    assert [(f["filename"], f["line"], f["name"]) for f in threads[0]["frames"]] == [
        ("a.py", 3, "f"), ('weird", line ', 7, "g"), ("b.py", 0, "h"),
    ]  # fmt: skip
    assert len(threads[1]["frames"]) == 256
    assert parse_traceback("HTTP/1.1 500\r\n\r\nnothing here") == []


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    with shared_tmp("areal-ws-") as path:
        yield path


class Started:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def standin(self, mode: str, directory: Path, *extra: str, nobody: bool = False) -> int:
        python = SYSTEM_PYTHON if nobody else sys.executable
        argv = [python, str(STANDIN), mode, str(directory), *extra]
        proc = subprocess.Popen([*NOBODY, *argv] if nobody else argv, env={"RANK": "0"})
        self.procs.append(proc)
        wait_for(lambda: (directory / f"ready-{proc.pid}").exists(), timeout=30,
                 what="the stand-in to listen")  # fmt: skip
        return proc.pid

    def sleeper(self, nobody: bool = False) -> int:
        python = SYSTEM_PYTHON if nobody else sys.executable
        argv = [python, "-c", "import time; time.sleep(600)"]
        proc = subprocess.Popen([*NOBODY, *argv] if nobody else argv, env={"RANK": "1"})
        self.procs.append(proc)
        return proc.pid


@pytest.fixture
def started() -> Iterator[Started]:
    s = Started()
    yield s
    for p in s.procs:
        p.kill()
        p.wait(timeout=30)


def test_a_standin_answer_is_read(started: Started, shared_dir: Path) -> None:
    pid = started.standin("ok", shared_dir)
    got = worker_stacks(pid)
    assert got["ok"] and got["source"] == "worker_server"
    assert got["endpoint"] == str(shared_dir / f"areal-fr-{pid}.sock")
    assert [t["thread_name"] for t in got["threads"]] == ["Thread 0x00007fe25f73d6c0", "MainThread"]
    assert (
        (shared_dir / f"got-{pid}")
        .read_bytes()
        .startswith(b"POST /handler/dump_traceback HTTP/1.0\r\n")
    )


@pytest.mark.parametrize(
    ("mode", "reason", "says"),
    [
        ("garbage", "error", "the answer holds no Python stack"),
        ("huge", "error", "answer over 4194304 bytes: not read"),
        ("trickle", "timeout", "gave no stack within 3s"),
        ("silent", "timeout", "gave no stack within 3s (its GIL is held"),
    ],
)
def test_a_bad_server_is_bounded(
    started: Started, shared_dir: Path, mode: str, reason: str, says: str
) -> None:
    pid = started.standin(mode, shared_dir)
    began = time.monotonic()
    got = worker_stacks(pid)
    took = time.monotonic() - began
    assert not got["ok"]
    assert says in got["error"]
    assert got["reason"] == reason
    assert took < MAX_DEADLINE * 10  # the deadline holds (a wide bound: a shared machine)


@needs_nobody
@pytest.mark.skipif(CAPSH is None or not Path(SYSTEM_PYTHON).exists(), reason="needs capsh")
def test_without_ptrace_a_socket_planted_for_the_rank_is_never_asked(
    started: Started, shared_dir: Path
) -> None:
    """Without CAP_SYS_PTRACE the agent cannot see which process holds a socket: it asks
    only when the listener's own credentials name the rank. `nobody`'s second process
    listens at the rank's socket name: refused before a byte is sent."""
    rank = started.sleeper(nobody=True)
    planter = started.standin("ok", shared_dir, str(rank), nobody=True)
    script = (
        "import json, sys; from areal_node.agent.worker_server import worker_stacks; "
        "print(json.dumps(worker_stacks(int(sys.argv[1]))))"
    )
    result = subprocess.run(
        [CAPSH or "capsh", "--drop=cap_sys_ptrace", "--", "-c", 'exec "$@"', "sh",
         sys.executable, "-c", script, str(rank)],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    got = json.loads(result.stdout)
    assert not got["ok"]
    assert f"served by process {planter}, not the rank ({rank})" in got["error"]
    assert (
        not (shared_dir / f"got-{planter}").exists()
        or not (shared_dir / f"got-{planter}").read_bytes()
    )


@needs_nobody
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs the system python3")
def test_stacks_and_traces_check_the_listener_one_way(started: Started, shared_dir: Path) -> None:
    """The stack request (worker_server.post) and the trace request (flight_recorder's
    _post) share one peer check (agent/rank_socket.py): `nobody`'s listener is refused as
    another user's, and as another process than the rank, in the same words by both,
    before a byte is sent; it is asked once it is the rank."""
    listener = started.standin("ok", shared_dir, nobody=True)
    sock = str(shared_dir / f"areal-fr-{listener}.sock")
    refusals = [
        (0, None, "served by uid 65534, not the rank's uid 0"),
        (65534, os.getpid(), f"served by process {listener}, not the rank ({os.getpid()})"),
    ]
    for uid, pid, says in refusals:
        deadline = time.monotonic() + MAX_DEADLINE
        with pytest.raises(WorkerServerError) as stacks:
            post(("unix", sock), HANDLER, deadline, uid, pid)
        with pytest.raises(PermissionError) as traces:
            fr_post(sock, "/handler/areal_fr_trace", uid, deadline, pid)
        assert str(stacks.value) == str(traces.value) == says
    answer = post(("unix", sock), HANDLER, time.monotonic() + MAX_DEADLINE, 65534, listener)
    assert b"(most recent call first)" in answer
    # The stand-in logs every byte it receives: only the one request it was asked.
    got = (shared_dir / f"got-{listener}").read_bytes()
    assert got.startswith(b"POST " + HANDLER.encode()) and got.count(b"POST ") == 1, got


def test_store_get_reads_a_real_tcpstore() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.PrefixStore("debug_server", store).set("rank2", "http://node7:41234")
    store.set("huge", "x" * 10_000)
    deadline = time.monotonic() + 5
    assert (
        store_get("127.0.0.1", store.port, "debug_server/rank2", deadline) == "http://node7:41234"
    )
    assert store_get("127.0.0.1", store.port, "debug_server/rank9", deadline) is None
    with pytest.raises(Exception, match="10000 bytes: not a worker address"):
        store_get("127.0.0.1", store.port, "huge", deadline)
