"""The console's reader thread against a hostile agent: replies nested 50,000 deep, lines
longer than the bound, garbage. Each fails its own request; the next request answers."""

from __future__ import annotations

import io
import sys
import textwrap

import pytest
from areal_console.core.connection.client import AgentClient, AgentError
from areal_console.core.connection.transport import TOO_LONG, ProcessChannel, bounded_readline

# A stand-in agent: a real process that answers `deep` with a reply nested 50,000 deep,
# `garbage` with a line that is no JSON, and everything else as `ping` does.
HOSTILE_AGENT = textwrap.dedent(
    """
    import json, sys
    out = sys.stdout.buffer
    out.write(b'{"event":"ready"}\\n'); out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        rid, op = request["id"], request["op"]
        if op == "deep":
            out.write(b'{"id":%d,"ok":true,"result":' % rid + b"[" * 50000 + b"]" * 50000 + b"}\\n")
        elif op == "silent":
            continue
        elif op == "garbage":
            out.write(b'{"id":%d,"ok":tru' % rid + b"\\n")
        else:
            out.write(json.dumps({"id": rid, "ok": True, "result": {"pong": op}}).encode() + b"\\n")
        out.flush()
    """
)


@pytest.fixture()
def hostile() -> AgentClient:
    client = AgentClient(ProcessChannel([sys.executable, "-c", HOSTILE_AGENT], "hostile agent"))
    yield client
    client.close()


def test_a_reply_nested_50000_deep_fails_its_request_and_the_reader_survives(
    hostile: AgentClient,
) -> None:
    with pytest.raises(AgentError, match="reply nested too deeply to decode"):
        hostile.request("deep", timeout=20)
    assert hostile.request("ping", timeout=10) == {"pong": "ping"}
    assert hostile.alive


def test_many_bad_replies_then_an_answer(hostile: AgentClient) -> None:
    bad = [hostile.request_async("deep") for _ in range(5)]
    for reply in bad:
        with pytest.raises(AgentError, match="nested too deeply"):
            reply.result(30)
    # A malformed line is noise (a login banner looks the same): it does not answer.
    garbage = hostile.request_async("garbage")
    assert hostile.request("ping", timeout=10) == {"pong": "ping"}
    assert not garbage.done()


def test_a_line_over_the_bound_becomes_a_marker_with_its_head() -> None:
    stream = io.BytesIO(b'{"id":7,"ok":true,"result":"' + b"x" * 5000 + b'"}\nnext\n')
    marker = bounded_readline(stream.readline, limit=1000)
    assert marker.startswith(TOO_LONG + b'{"id":7,') and marker.endswith(b"\n")
    assert len(marker) < 300
    assert bounded_readline(stream.readline, limit=1000) == b"next\n"
    assert bounded_readline(stream.readline, limit=1000) == b""
    exact = io.BytesIO(b"a" * 999 + b"\n")
    assert bounded_readline(exact.readline, limit=1000) == b"a" * 999 + b"\n"


def test_a_too_long_marker_fails_the_request_it_names(hostile: AgentClient) -> None:
    pending = hostile.request_async("silent")
    rid = max(hostile._pending)
    hostile._handle_line(TOO_LONG + b'{"id":%d,"ok":true,"result":"xxxx\n' % rid)
    with pytest.raises(AgentError, match="reply longer than"):
        pending.result(1)
