"""Hostile Flight Recorder replies on the console side: a rank's process (another user's,
possibly) answers whatever it likes on its socket, and the agent passes the trace on. A
reply that is not a trace must cost that rank its ledger entry (a per-rank error, exit 3),
never the capture's stacks or the other ranks' traces."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.ledger.trace import TraceError, parse_trace
from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.report import capture_json, text_report
from conftest import run_cli

from tests.support.waits import wait_for

RAW = Path(__file__).parents[1] / "data" / "pyspy" / "ledger_op.json"
DEEP = 50_000


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def hostile_traces() -> dict[str, Any]:
    good = json.loads(RAW.read_text())["nodes"][0]["fr"]["live"][0]["trace"]
    bad_key = copy.deepcopy(good)
    bad_key["groups"][0]["keys"] = [0, 0, 0, 7]  # not a row of the table
    text_key, float_key = copy.deepcopy(good), copy.deepcopy(good)
    text_key["groups"][0]["keys"] = [0, 0, 0, "1"]
    float_key["groups"][0]["keys"] = [0, 0, 0, 0.0]
    huge_range = copy.deepcopy(good)
    huge_range["groups"][0]["seq_range"] = [1, 2**70]
    return {
        "pg_config is a mapping of ints": {**good, "pg_config": {"0": 5}},
        "pg_config is a list": {**good, "pg_config": [1]},
        "pg_config nested deep": {**good, "pg_config": nested(DEEP)},
        "group name nested deep": {**good, "groups": [{"name": nested(DEEP)}]},
        "groups is a string": {**good, "groups": "0"},
        "a group is a number": {**good, "groups": [5]},
        "key out of the table": bad_key,
        "a key is text": text_key,
        "a key is a float": float_key,
        "range past int64": huge_range,
        "not a mapping": [1],
        "status values absurd": {**good, "pg_status": {"0": {"last_enqueued_collective": 1e309}}},
    }


@pytest.mark.parametrize("case", ["a key is text", "a key is a float", "key out of the table"])
def test_keys_that_are_not_rows_are_refused(case: str) -> None:
    with pytest.raises(TraceError, match="a call's key is not a row of its table"):
        parse_trace(0, "n", "live", "/s", hostile_traces()[case])


def test_keys_are_plain_ints_and_a_table_is_checked_even_when_seen() -> None:
    good = json.loads(RAW.read_text())["nodes"][0]["fr"]["live"][0]["trace"]
    keys = good["groups"][0]["keys"]
    as_bools = copy.deepcopy(good)
    as_bools["groups"][0]["keys"] = [bool(k) if k in (0, 1) else k for k in keys]
    read = parse_trace(0, "n", "live", "/s", as_bools).groups[good["groups"][0]["name"]]
    assert read.keys == keys and {type(k) for k in read.keys} == {int}
    parse_trace(0, "n", "live", "/s", good)  # its table checked once
    bad_row = copy.deepcopy(good)
    bad_row["groups"][0]["table"][0][1] = [[-1]]  # a negative dimension
    with pytest.raises(TraceError, match="out of range"):
        parse_trace(0, "n", "live", "/s", bad_row)


@pytest.mark.parametrize("case", list(hostile_traces()))
def test_a_hostile_trace_is_a_trace_error_or_a_trace(case: str) -> None:
    data = hostile_traces()[case]
    try:
        trace = parse_trace(0, "n", "live", "/s", data)
    except TraceError as exc:
        assert str(exc).startswith("malformed trace")
    else:  # what parsed must be usable by the analysis
        for group in trace.groups.values():
            for seq in group.seqs[-3:]:
                group.call_at(seq)


@pytest.mark.parametrize(
    "case", ["pg_config is a mapping of ints", "pg_config is a list", "group name nested deep"]
)
def test_one_hostile_rank_keeps_the_stacks_and_the_other_ranks(case: str) -> None:
    raw = json.loads(RAW.read_text())
    live = raw["nodes"][0]["fr"]["live"]
    live[2]["trace"] = hostile_traces()[case]
    capture = build_capture(raw)
    assert capture.ledger is not None
    assert sorted(capture.ledger.sources) == [0, 1, 3]
    assert len(capture.ledger.errors) == 1 and "rank 2: live trace" in capture.ledger.errors[0]
    assert all(r.state == "ok" for r in capture.ranks if r.rank is not None)
    assert "  error: " in text_report(capture)
    reopened = capture_from_json(json.loads(json.dumps(capture_json(capture))))
    assert reopened.ledger is not None and reopened.ledger.errors == capture.ledger.errors


FAKE_RANK = textwrap.dedent(
    """
    import os, socket, sys, time
    body = open(sys.argv[1], "rb").read()
    path = os.path.join(os.environ["AREAL_FR_SOCKET_DIR"], f"areal-fr-{os.getpid()}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print("ready", flush=True)
    def hang_in_collective():
        while True:
            conn, _ = server.accept()
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\\r\\nContent-Length: {len(body)}\\r\\n\\r\\n"
            conn.sendall(head.encode() + body)
            conn.close()
    hang_in_collective()
    """
)


@pytest.fixture()
def hostile_rank(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A process with rank variables whose recorder socket answers `request.param`."""
    body = tmp_path / "body.json"
    body.write_text(request.param)
    marker = f"fake-rank-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    env["AREAL_FR_SOCKET_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_RANK, str(body), marker],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        wait_for(lambda: any(tmp_path.glob("areal-fr-*.sock")), what="the rank's socket")
        yield marker
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "hostile_rank",
    [
        json.dumps({"entries": [], "pg_config": {"0": 5}, "pg_status": {}}),
        json.dumps({"entries": [], "pg_config": [1], "pg_status": {}}),
    ],
    ids=["pg_config-ints", "pg_config-list"],
    indirect=True,
)
def test_stacks_with_a_hostile_recorder_reply_keeps_the_stacks_exit_3(hostile_rank: str) -> None:
    result = run_cli("stacks", "--local", "--match", hostile_rank, "--json")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "warning: " in result.stderr and "rank 0: live trace" in result.stderr
    doc = json.loads(result.stdout)
    ranks = [r for r in doc["ranks"] if r["rank"] == 0]
    assert ranks and ranks[0]["state"] == "ok"
    frames = [f["function"] for t in ranks[0]["threads"] for f in t["frames"]]
    assert "hang_in_collective" in frames
    assert "malformed trace" in doc["ledger"]["errors"][0]
