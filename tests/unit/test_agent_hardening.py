"""The agent under hostile input: replies that cannot be encoded, ops past their deadline,
a FIFO or symlink in place of a log, an agent that lost its console."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.client import AgentClient, AgentError
from areal_console.core.connection.transport import InProcessChannel
from areal_node.agent import protocol
from areal_node.agent.protocol import OPS, ReplyUnsendable, encode_message
from areal_node.agent.threads import Workers
from hypothesis import given
from hypothesis import strategies as st

NODE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(protocol.__file__)))


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _shared(levels: int) -> Any:
    """A list whose two items are the same list, `levels` times: 2**levels leaves."""
    value: Any = "x" * 64
    for _ in range(levels):
        value = [value, value]
    return value


PLANTED = {
    "test_deep_reply": lambda agent, args: {"trace": _deep(200_000)},
    "test_big_int_reply": lambda agent, args: {"pg_config": 1 << 20_000},
    "test_shared_reply": lambda agent, args: {"entries": _shared(40)},
    "test_key_reply": lambda agent, args: {(1, 2): "a tuple key"},
}


@pytest.fixture()
def in_process() -> Iterator[AgentClient]:
    """An agent served by a thread of this process: the stand-in ops are registered here."""
    added = {name: fn for name, fn in PLANTED.items() if name not in OPS}
    OPS.update(added)
    client = AgentClient(InProcessChannel())
    client.start(gpus=False)
    yield client
    client.close()
    for name in added:
        OPS.pop(name, None)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_reply_that_cannot_be_encoded_answers_an_error(
    in_process: AgentClient, name: str
) -> None:
    # The shared subtree is not expanded to gigabytes: the reply's own error comes, not
    # the request's timeout (no wall-clock bound: it failed at 10 s under a load of 25).
    with pytest.raises(AgentError, match=r"reply"):
        in_process.request(name, timeout=60)
    assert in_process.request("ping", timeout=5)["time"] > 0


def test_many_unencodable_replies_leave_the_agent_answering(in_process: AgentClient) -> None:
    """Before: each such reply killed its worker thread without a reply; after 16, the
    agent answered nothing."""
    replies = [in_process.request_async("test_big_int_reply") for _ in range(40)]
    for reply in replies:
        with pytest.raises(AgentError, match="integer of 20001 bits"):
            reply.result(20)
    assert in_process.request("ping", timeout=5)["time"] > 0


def test_encode_message_bounds() -> None:
    assert encode_message({"id": 1, "ok": True, "result": _deep(150)}).endswith(b"\n")
    with pytest.raises(ReplyUnsendable, match="nested deeper"):
        encode_message({"result": _deep(500)})
    with pytest.raises(ReplyUnsendable, match="larger than"):
        encode_message({"result": _shared(30)})
    with pytest.raises(ReplyUnsendable, match="cannot be encoded"):
        encode_message({"result": {(1,): 2}})


HANG_ENTERED: list[Any] = []  # the hanging op's "it is running now" event, per test


@pytest.fixture()
def hanging_op(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import threading

    release = threading.Event()
    entered = threading.Event()
    HANG_ENTERED.append(entered)

    def hang(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        release.wait(60)
        return {"late": True}

    OPS["test_hang"] = hang
    monkeypatch.setitem(protocol.DEADLINES, "test_hang", 0.5)
    yield release
    release.set()
    OPS.pop("test_hang", None)
    HANG_ENTERED.remove(entered)


def test_an_op_past_its_deadline_answers_a_timeout_error(hanging_op: Any) -> None:
    client = AgentClient(InProcessChannel())
    client.start(gpus=False)
    try:
        t0 = time.monotonic()
        with pytest.raises(AgentError, match=r"test_hang: no answer within 0.5 s"):
            client.request("test_hang", timeout=10)
        assert time.monotonic() - t0 < 5  # the 0.5 s deadline with a 10x margin
        # More stuck calls than the pool has threads: each is answered at its deadline,
        # and the agent still serves (stuck threads are replaced).
        stuck = [client.request_async("test_hang") for _ in range(24)]
        for reply in stuck:
            with pytest.raises(AgentError, match="no answer within"):
                reply.result(10)
        assert client.request("ping", timeout=5)["time"] > 0
    finally:
        hanging_op.set()
        client.close()


def test_every_served_op_has_a_named_deadline() -> None:
    import areal_node.batches.ops as batch_ops
    from areal_node.agent.protocol import DEADLINES, known_ops

    for name in known_ops():
        if not name.startswith("test_"):
            assert name in DEADLINES, name
    for name in batch_ops.OPS:
        assert protocol.deadline(name, {}) == protocol.DEFAULT_DEADLINE
    assert protocol.deadline("pyspy", {"timeout": 10.0}) == DEADLINES["pyspy"] + 10
    assert protocol.deadline("pyspy", {"timeout": 1e9}) == protocol.MAX_DEADLINE
    assert protocol.deadline("pyspy", {"timeout": "x"}) == DEADLINES["pyspy"]


def test_pool_join_is_bounded() -> None:
    import threading

    release = threading.Event()
    pool = Workers(2, "t")
    pool.submit(release.wait, 30)
    t0 = time.monotonic()
    pool.shutdown(wait=True, timeout=0.3)
    assert time.monotonic() - t0 < 3  # the 0.3 s timeout with a 10x margin (30 s if not)
    release.set()


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _agent_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": NODE_DIR}


def test_an_agent_whose_console_died_exits_on_its_own(tmp_path) -> None:
    """The console (here a shell) is killed while another process still holds the
    agent's stdin open (no EOF ever comes), after a request for a FIFO was answered: the
    agent notices it was adopted and exits."""
    fifo = tmp_path / "main.log"
    os.mkfifo(fifo)
    pidfile = tmp_path / "agent.pid"
    replies = tmp_path / "replies.jsonl"
    request = json.dumps({"id": 1, "op": "file_read", "args": {"path": str(fifo)}})
    script = (
        f"(echo '{request}'; sleep 600) | "
        f"{sys.executable} -c 'from areal_node.agent.serve import main; main()' > {replies} &"
        f" echo $! > {pidfile}; wait"
    )
    console = subprocess.Popen(["sh", "-c", script], env=_agent_env(), start_new_session=True)
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        agent = int(pidfile.read_text())
        # Serving: wait for the reply to the request (polled, not a guessed sleep).
        deadline = time.monotonic() + 30
        while '"id": 1' not in _text(replies) and '"id":1' not in _text(replies):
            assert time.monotonic() < deadline, "the agent never answered"
            time.sleep(0.05)
        os.kill(console.pid, signal.SIGKILL)
        console.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and os.path.exists(f"/proc/{agent}"):
            if Path(f"/proc/{agent}/stat").read_text().split(")")[1].split()[0] == "Z":
                break
            time.sleep(0.1)
        gone_after = time.monotonic() - t0
        # It looks every PARENT_CHECK_EVERY (1 s): a 10x bound; one that never exits
        # is still there after the 60 s looked for.
        assert gone_after < 15, f"the agent was still running {gone_after:.1f} s later"
    finally:
        os.killpg(console.pid, signal.SIGKILL)


def test_agent_exits_promptly_on_eof_with_a_request_stuck(hanging_op: Any) -> None:
    """EOF while a request hangs: the in-process agent's serve() returns, the pool is
    not joined forever (main() bounds it; here serve() itself must return)."""
    channel = InProcessChannel()
    client = AgentClient(channel)
    client.start(gpus=False)
    client.request_async("test_hang")
    assert HANG_ENTERED[-1].wait(10)  # the request is in the op, not a guessed sleep
    channel.close()
    channel._thread.join(30)  # returns at once; a serve() joining the stuck pool, never
    assert not channel._thread.is_alive()


LONG_ARG = "x" * (120 << 10)  # under MAX_ARG_STRLEN (128 KiB): 9 of them make ~1 MB


def test_200_processes_with_1mb_command_lines_give_a_small_sample(tmp_path) -> None:
    """One rank with a 1 MB command line forks 199 more (copy-on-write: the same argv and
    RANK): the agent reads at most 64 KB of each and sends 16 KB."""
    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import LocalChannel
    from areal_node.agent.procfs import CMDLINE_SEND_MAX

    script = (
        "import os, sys, time\n"
        "kids = []\n"
        "for _ in range(199):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(120); os._exit(0)\n"
        "    kids.append(pid)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *([LONG_ARG] * 9)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "RANK": "0", "WORLD_SIZE": "200"},
        start_new_session=True,
    )
    client = AgentClient(LocalChannel())
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        client.start(gpus=False)
        sample = client.request("sample", {"cpu": False, "gpus": False}, timeout=60)
        mine = [p for p in sample["processes"] if LONG_ARG[:100] in p["cmdline"]]
        assert len(mine) == 200
        for record in mine:
            assert len(record["cmdline"]) <= CMDLINE_SEND_MAX + 64
            assert record["cmdline"].endswith(" more characters)")
        size = len(json.dumps(sample))
        assert size < 8 << 20, size  # before: over 200 MB
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# Properties of the agent-side parsers and encoders (the CI profile in conftest.py).

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=40,
)


@given(JSONISH)
def test_property_encode_message_round_trips_or_refuses(value: Any) -> None:
    try:
        data = encode_message({"id": 1, "ok": True, "result": value})
    except ReplyUnsendable:
        return
    assert data.endswith(b"\n") and b"\n" not in data[:-1]
    assert json.loads(data)["result"] == value


@given(st.binary(max_size=600), st.sampled_from(["RANK", "SLURM_PROCID", "PATH"]))
def test_property_parse_environ_keeps_only_bounded_rank_variables(raw: bytes, name: str) -> None:
    from areal_node.agent.procfs import ENV_VALUE_MAX, RANK_VARS, parse_environ

    env = parse_environ(raw + b"\0" + name.encode() + b"=" + b"7" * 5000)
    assert set(env) <= set(RANK_VARS)
    assert all(len(v) <= ENV_VALUE_MAX for v in env.values())
    if name in RANK_VARS:
        assert env[name] == "7" * ENV_VALUE_MAX


def _environ_by_splitting(raw: bytes, wanted: tuple[str, ...]) -> dict[str, str]:
    """The plain reading `parse_environ` must agree with: split into entries, decode each
    name, keep the wanted ones (a later entry of a name replaces an earlier one)."""
    from areal_node.agent.procfs import ENV_VALUE_MAX

    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in wanted:
            env[name] = value[:ENV_VALUE_MAX].decode(errors="replace")
    return env


ENV_NAMES = st.sampled_from(["RANK", "LOCAL_RANK", "WORLD_SIZE", "PATH", "XRANK", "RANK_", ""])
ENV_ENTRIES = st.lists(
    st.tuples(ENV_NAMES, st.sampled_from([b"=", b"", b"=="]), st.binary(max_size=5000)).map(
        lambda e: e[0].encode() + e[1] + e[2].replace(b"\0", b"")
    ),
    max_size=12,
)


@given(ENV_ENTRIES, st.binary(max_size=40))
def test_property_parse_environ_reads_as_splitting_the_block_would(
    entries: list[bytes], tail: bytes
) -> None:
    """Names found by search, not by splitting: the same variables, values and order, for
    repeated names, prefixes of names, entries without `=`, bytes that are not UTF-8 and a
    block cut short by the read bound."""
    from areal_node.agent.procfs import RANK_VARS, parse_environ

    raw = b"\0".join(entries) + tail
    expected = _environ_by_splitting(raw, RANK_VARS)
    got = parse_environ(raw)
    assert got == expected and list(got) == list(expected)
    for name in ("RANK", "WORLD_SIZE"):
        only = parse_environ(raw, (name,))
        assert only == {k: v for k, v in expected.items() if k == name}


def test_parse_environ_agrees_on_this_machines_processes() -> None:
    from areal_node.agent.procfs import RANK_VARS, parse_environ

    blocks = []
    for path in Path("/proc").glob("[0-9]*/environ"):
        try:
            blocks.append(path.read_bytes())
        except OSError:  # gone, or another user's
            continue
    assert len(blocks) >= 3
    for raw in [*blocks, b"\0".join(blocks)]:
        expected = _environ_by_splitting(raw, RANK_VARS)
        assert parse_environ(raw) == expected and list(parse_environ(raw)) == list(expected)


@given(st.text(max_size=300), st.integers(0, 200), st.integers(0, 10**6))
def test_property_cap_text_is_bounded_and_says_what_it_cut(
    text: str, limit: int, more: int
) -> None:
    from areal_node.agent.procfs import cap_text

    out = cap_text(text, limit, more)
    if len(text) <= limit and not more:
        assert out == text
    else:
        assert out.startswith(text[:limit]) and len(out) <= limit + 40
        assert out.endswith(f"({max(0, len(text) - limit) + more:,} more characters)")


@given(st.binary(max_size=3000), st.integers(1, 2500))
def test_property_read_capped_keeps_the_head_and_counts_all(
    tmp_path_factory, data: bytes, keep: int
) -> None:
    from areal_node.agent.procfs import read_capped

    path = tmp_path_factory.mktemp("cap") / "f"
    path.write_bytes(data)
    head, total = read_capped(str(path), keep)
    assert head == data[:keep] and total == len(data)


def _proc(pid: int, ppid: int, cmdline: list[str], env: dict[str, str]) -> dict[str, Any]:
    comm = os.path.basename(cmdline[0])[:15]
    return {"pid": pid, "ppid": ppid, "comm": comm, "state": "S", "cmdline": cmdline,
            "env": env, "env_error": None, "cpu_percent": None}  # fmt: skip


def test_launchers_and_children_of_ranks_get_no_rank() -> None:
    """Two srun tasks, each `bash -c` -> torchrun (SLURM_PROCID k) -> workers (RANK r,
    SLURM_PROCID k); rank 0 has a data loader child (same RANK); an `srun python` task
    (SLURM_PROCID 2) has a child of its own. Ranks: 0-4 once each, and the srun task."""
    from areal_node.agent.processes import select_processes

    py = "/usr/bin/python3"
    torchrun = [py, "-m", "torch.distributed.run", "--nproc-per-node=3", "train.py"]
    procs: dict[int, dict[str, Any]] = {}
    pid = 100
    rank = 0
    for task, nproc in ((0, 3), (1, 2)):
        slurm = {"SLURM_PROCID": str(task), "SLURM_NTASKS": "3", "SLURM_JOB_ID": "9"}
        shell, launcher = pid, pid + 1
        procs[shell] = _proc(
            shell, 1, ["bash", "-c", "exec python -m torch.distributed.run"], slurm
        )
        procs[launcher] = _proc(launcher, shell, torchrun, slurm)
        pid += 2
        for local in range(nproc):
            env = {**slurm, "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": "5"}
            procs[pid] = _proc(pid, launcher, [py, "train.py"], env)
            if rank == 0:
                procs[pid + 1] = _proc(pid + 1, pid, [py, "-c", "from multiprocessing"], env)
                pid += 1
            pid += 1
            rank += 1
    lone = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "9"}
    procs[900] = _proc(900, 1, [py, "solo.py"], lone)
    procs[901] = _proc(901, 900, [py, "-c", "from multiprocessing"], lone)
    select_processes(procs, include_all=True)
    ranks = sorted((p["rank"], p["pid"]) for p in procs.values() if p["rank"] is not None)
    assert [r for r, _ in ranks] == [0, 1, 2, 2, 3, 4]
    assert [r for r, pid in ranks if pid == 900] == [2]
    for p in procs.values():
        if p["role"] == "launcher" or p["cmdline"][0] == "bash":
            assert p["rank"] is None, p


def test_the_deadline_table_in_the_docs_is_the_agents() -> None:
    import re

    doc = (
        Path(__file__).resolve().parents[2] / "docs" / "design" / "agent-protocol.md"
    ).read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (\d+)(?: \+ `\w+`)? \|$", doc, re.MULTILINE))
    assert {k: float(v) for k, v in rows.items()} == protocol.DEADLINES


def test_a_controllers_other_children_do_not_join_its_workers_job() -> None:
    """A Python process that started AReaL workers (through `bash -c ... | tee`) and,
    beside them, a torchrun job of its own: the torchrun ranks keep no AReaL job (a
    test runner or notebook is such a parent)."""
    from areal_node.agent.processes import select_processes

    py = "/usr/bin/python3"
    procs: dict[int, dict[str, Any]] = {10: _proc(10, 1, [py, "driver.py"], {})}
    for index in (0, 1):
        shell, worker = 20 + 10 * index, 21 + 10 * index
        procs[shell] = _proc(shell, 10, ["bash", "-c", "python3 -m areal.infra.rpc.rpc_server"],
                             {"SLURM_PROCID": str(index)})  # fmt: skip
        procs[worker] = _proc(
            worker, shell,
            [py, "-m", "areal.infra.rpc.rpc_server", "--port", "0", "--experiment-name", "e",
             "--trial-name", "t", "--role", "actor"],
            {"SLURM_PROCID": str(index)},
        )  # fmt: skip
    for rank in range(4):
        env = {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(rank)}
        procs[50 + rank] = _proc(50 + rank, 10, [py, "gloo_ranks.py"], env)
    select_processes(procs, include_all=True)
    job = [p for p in procs.values() if p["job"] == "e/t"]
    assert sorted(p["rank"] for p in job if p["rank"] is not None) == [0, 1]
    assert all(procs[50 + r]["job"] is None for r in range(4))
