"""Polling inference servers against stand-in server processes (tests/jobs/standin_server.py,
answering the bytes SGLang's, vLLM's and AReaL's data proxy's code produce): the address
comes from the server process's own sockets in /proc, every request is bounded, and a
slow, trickling, truncated, oversized or hostile server yields an error, not a hang."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from areal_node.server_poll import (
    ServerPoller,
    attach_state,
    http_get,
    listeners,
    parse_http,
    parse_net_table,
    poll_server,
    verified_endpoint,
)

from tests.support.nobody import NOBODY, needs_nobody, shared_tmp
from tests.support.waits import wait_for

STANDIN = Path(__file__).parents[1] / "jobs" / "standin_server.py"


class Standin:
    def __init__(self, tmp: Path, *args: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.ready = tmp / "ready"
        self.log = tmp / "requests.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(STANDIN),
                "--ready",
                str(self.ready),
                "--log",
                str(self.log),
                *args,
            ]
        )
        deadline = time.monotonic() + 20
        while not (self.ready.exists() and self.ready.read_text().strip()):
            assert self.proc.poll() is None, "stand-in server exited"
            assert time.monotonic() < deadline, "stand-in server did not start"
            time.sleep(0.05)
        self.ports = [int(p) for p in self.ready.read_text().split()]
        self.port = self.ports[0]

    @property
    def requests(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    started: list[Standin] = []

    def start(*args: str) -> Standin:
        s = Standin(tmp_path / str(len(started)), *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def target(s: Standin, kind: str) -> tuple[str, str, int]:
    """The poller's (kind, host, port) for a stand-in, as verified from /proc."""
    endpoint, why = verified_endpoint(s.proc.pid, s.port)
    assert endpoint is not None, why
    return kind, endpoint.host, endpoint.port


def poll(s: Standin, kind: str, deadline: float = 2.0) -> dict:
    return poll_server(*target(s, kind), deadline)


def test_sglang_metrics_and_weight_version(standin: Callable[..., Standin]) -> None:
    s = standin("--kind", "sglang", "--version", "7", "--throughput", "2345")
    result = poll(s, "sglang")
    assert result["ok"] and result["errors"] == {}
    assert result["metrics"]["sglang:gen_throughput"] == 2345
    assert result["metrics"]["sglang:num_running_reqs"] == 4
    assert result["weight_version"] == 7
    assert s.requests == ["/metrics", "/model_info"]


def test_vllm_metrics(standin: Callable[..., Standin]) -> None:
    s = standin("--kind", "vllm")
    result = poll(s, "vllm")
    assert result["ok"] and result["errors"] == {}
    assert result["metrics"]["vllm:num_requests_running"] == 4
    # Without VLLM_SERVER_DEV_MODE, GET /is_paused answers 404: the state is not known
    # (AReaL's own pause routes are POST only), and that is no failed poll.
    assert "paused" not in result and s.requests == ["/metrics", "/is_paused"]


def test_vllm_dev_mode_reports_its_pause_state(standin: Callable[..., Standin]) -> None:
    assert poll(standin("--kind", "vllm", "--dev-mode", "--paused"), "vllm")["paused"] is True
    assert poll(standin("--kind", "vllm", "--dev-mode"), "vllm")["paused"] is False
    poller = ServerPoller(workers=1, interval=0.1)
    try:
        s = standin("--kind", "vllm")
        endpoint, _ = verified_endpoint(s.proc.pid, s.port)
        assert endpoint is not None
        target = [("vllm", endpoint.host, endpoint.port)]
        poller.state(target)
        poller.wait_first(target, 5)
        (state,) = poller.state(target).values()
    finally:
        poller.close()
    assert state["paused"] is None and "VLLM_SERVER_DEV_MODE=1" in state["paused_note"]


def test_data_proxy_paused_and_version(standin: Callable[..., Standin]) -> None:
    result = poll(standin("--kind", "data_proxy", "--paused", "--version", "12"), "data_proxy")
    assert result["ok"] and result["paused"] is True and result["weight_version"] == 12


def test_wildcard_and_ipv6_binds_are_asked_on_loopback(standin: Callable[..., Standin]) -> None:
    s = standin("--kind", "data_proxy", "--host", "0.0.0.0")
    endpoint, _ = verified_endpoint(s.proc.pid, s.port)
    assert endpoint is not None and endpoint.host == "127.0.0.1" and endpoint.bound == "0.0.0.0"
    s6 = standin("--kind", "data_proxy", "--host", "::1")
    endpoint, _ = verified_endpoint(s6.proc.pid, s6.port)
    assert endpoint is not None and endpoint.host == "::1"
    assert poll_server("data_proxy", endpoint.host, endpoint.port)["paused"] is False


def test_a_port_named_in_argv_but_held_by_another_process_is_not_polled(
    standin: Callable[..., Standin],
) -> None:
    victim = standin("--kind", "sglang")
    liar = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "sglang.launch_server",
         "--host", "127.0.0.1/admin/drop?", "--port", str(victim.port)]
    )  # fmt: skip
    try:
        endpoint, why = verified_endpoint(liar.pid, victim.port)
        assert endpoint is None
        assert f"does not listen on port {victim.port}" in why
        assert listeners(liar.pid) == []
    finally:
        liar.kill()
        liar.wait()
    assert victim.requests == []


def test_a_process_whose_sockets_cannot_be_read_is_not_polled(tmp_path: Path) -> None:
    endpoint, why = verified_endpoint(999_999_999, 30000, proc_root=str(tmp_path))
    assert endpoint is None and "cannot be read" in why


def test_slow_and_trickling_servers_hit_the_overall_deadline(
    standin: Callable[..., Standin],
) -> None:
    for mode in ("slow", "trickle"):
        s = standin("--kind", "sglang", "--mode", mode)
        t0 = time.monotonic()
        result = poll(s, "sglang", deadline=1.0)
        took = time.monotonic() - t0
        assert took < 10, (mode, took)  # the 1 s deadline x10; unbounded, 30 s or more
        assert not result["ok"] and "no complete answer within" in result["errors"]["/metrics"]
        assert "/model_info" in result["errors"]  # no time left for the second route


def test_truncated_oversized_and_garbage_answers(standin: Callable[..., Standin]) -> None:
    truncated = poll(standin("--kind", "sglang", "--mode", "truncated"), "sglang")
    assert "answer truncated" in truncated["errors"]["/metrics"]
    oversized = poll(standin("--kind", "vllm", "--mode", "oversized"), "vllm", deadline=5.0)
    assert "answer over" in oversized["errors"]["/metrics"]
    garbage = poll(standin("--kind", "data_proxy", "--mode", "garbage"), "data_proxy")
    assert garbage["errors"]["/health"] == "malformed HTTP answer (no header end)"


def test_hostile_answers_give_bounded_values(standin: Callable[..., Standin]) -> None:
    result = poll(standin("--kind", "sglang", "--mode", "hostile"), "sglang")
    assert result["metrics"] == {"sglang:num_running_reqs": 1e308}  # NaN dropped, junk skipped
    assert "malformed lines skipped" in result["errors"]["/metrics"]
    assert result["errors"]["/model_info"] == "not a JSON object"  # 100,000 nested [
    proxy = poll(standin("--kind", "data_proxy", "--mode", "hostile"), "data_proxy")
    assert proxy["paused"] is None and proxy["weight_version"] is None


def test_odd_versions_and_pause_states_are_no_values_and_keep_the_poll(
    standin: Callable[..., Standin],
) -> None:
    sglang = poll(standin("--kind", "sglang", "--mode", "odd_versions"), "sglang")
    assert sglang["ok"] and sglang["weight_version"] == "\u00b2\x1b]2;pwned\x07"  # a label
    assert sglang["metrics"]["sglang:num_running_reqs"] > 0  # the metrics are kept
    proxy = poll(standin("--kind", "data_proxy", "--mode", "odd_versions"), "data_proxy")
    assert proxy["ok"] and proxy["weight_version"] is None and proxy["paused"] is None
    vllm = poll(standin("--kind", "vllm", "--dev-mode", "--mode", "odd_versions"), "vllm")
    assert vllm["ok"] and vllm["paused"] is None and vllm["metrics"]


def test_parse_http_refuses_what_an_http10_answer_cannot_be() -> None:
    assert parse_http(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello").error
    assert parse_http(b"HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n").error == "HTTP 500"
    assert parse_http(b"SSH-2.0-OpenSSH\r\n\r\n").error == "malformed HTTP status line"
    assert parse_http(b"HTTP/1.0 200 OK\r\ncontent-length: x\r\n\r\n").error


def test_net_table_rows_decode_to_listeners() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
        "   1: 00000000:1F92 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
        "   2: 0100007F:7531 0100007F:9999 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n"
        "   3: 0100007F:7532 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1\n"
    )
    found = parse_net_table(table, {"111", "222", "333"})
    assert [(x.host, x.port, x.bound) for x in found] == [
        ("127.0.0.1", 30000, "127.0.0.1"),
        ("127.0.0.1", 8082, "0.0.0.0"),
    ]  # 333 is a connection, 444 another process's


def test_http_get_connection_refused_is_an_error() -> None:
    answer = http_get("127.0.0.1", 1, "/metrics", time.monotonic() + 1)
    assert answer.error == "connection refused"


def test_poller_never_waits_and_keeps_one_request_in_flight(
    standin: Callable[..., Standin],
) -> None:
    slow = standin("--kind", "data_proxy", "--mode", "slow")
    fast = standin("--kind", "sglang", "--version", "3")
    poller = ServerPoller(workers=2, interval=0.2)
    targets = [("data_proxy", "127.0.0.1", slow.port), ("sglang", "127.0.0.1", fast.port)]
    try:
        t0 = time.monotonic()
        first = poller.state(targets)
        assert time.monotonic() - t0 < 3  # it answers at once; waiting would take 30 s
        assert all(v["polled"] is False for v in first.values())
        deadline = time.monotonic() + 10
        while True:
            state = poller.state(targets)
            if len(state[f"sglang|127.0.0.1|{fast.port}"]["throughput"]) >= 3:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        got = state[f"sglang|127.0.0.1|{fast.port}"]
        assert got["weight_version"] == 3 and got["metrics"]["sglang:gen_throughput"] == 1800
        assert slow.requests.count("/health") == 1  # one in flight, never a second
    finally:
        poller.close()


def test_attach_state_fills_verified_servers_and_says_why_not(
    standin: Callable[..., Standin],
) -> None:
    good = standin("--kind", "data_proxy", "--paused", "--version", "5")
    records = [
        {"pid": good.proc.pid, "server": {"kind": "data_proxy", "port": good.port}},
        {"pid": good.proc.pid, "server": {"kind": "data_proxy", "port": good.port + 1}},
        {"pid": good.proc.pid, "server": {"kind": "sglang", "port": "x"}},
        {"pid": good.proc.pid, "server": None},
    ]
    poller = ServerPoller(workers=1, interval=0.1)
    try:
        verified = attach_state(records, poller)
        assert records[0]["server"]["polled"] is False  # scheduled, not awaited
        assert verified[id(records[0]["server"])].port == good.port and len(verified) == 1
        deadline = time.monotonic() + 10
        while not records[0]["server"].get("polled"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
            attach_state(records, poller)
    finally:
        poller.close()
    assert records[0]["server"]["paused"] is True and records[0]["server"]["weight_version"] == 5
    assert "does not listen on port" in records[1]["server"]["poll_error"]
    assert records[2]["server"]["poll_error"] == "no port to poll"
    assert records[3]["server"] is None


def test_every_listener_of_a_busy_process_is_seen() -> None:
    """procfs hands /proc/PID/net/tcp over about a page per read: a node with hundreds of
    sockets has its server's row far past the first read (a GPU node's usual case)."""
    from areal_node.server_poll import listeners

    socks = []
    try:
        for _ in range(300):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            socks.append(s)
        ports = {s.getsockname()[1] for s in socks}
        seen = {lst.port for lst in listeners(os.getpid())}
        assert ports <= seen, f"{len(ports - seen)} of 300 listeners missed"
    finally:
        for s in socks:
            s.close()


def test_trickling_health_answers_cost_one_deadline_in_all() -> None:
    """Twenty servers that answer `/health` a byte every 0.3 s (no read ever times out):
    the health poll of all of them ends within one deadline, each with its error."""
    import threading

    from areal_node.agent.servers import HEALTH_TIMEOUT, HealthPoller

    stop = threading.Event()
    listeners = []

    def trickle(server: socket.socket) -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            # About 30 s of bytes: a per-read timeout alone would wait that long.
            for byte in b"HTTP/1.0 200 OK\r\nX-Pad: " + b"x" * 80 + b"\r\n\r\n":
                if stop.wait(0.3):
                    return
                conn.sendall(bytes([byte]))

    for _ in range(20):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        listeners.append(server)
        threading.Thread(target=trickle, args=(server,), daemon=True).start()
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}/health" for s in listeners]
    try:
        started = time.monotonic()
        answers = HealthPoller().health(urls)
        elapsed = time.monotonic() - started
        assert elapsed < HEALTH_TIMEOUT * 10, elapsed  # one 1 s deadline; 30 s per read
        assert set(answers) == set(urls)
        assert all(a["ok"] is False and "no answer within" in a["error"] for a in answers.values())
    finally:
        stop.set()
        for s in listeners:
            s.close()


def test_a_malformed_address_is_an_error_not_a_raise() -> None:
    from areal_node.agent.servers import HealthPoller

    answer = HealthPoller.poll("http://[x/health")
    assert answer["ok"] is False and answer["error"].startswith("bad server address")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


@needs_nobody
def test_a_server_in_another_network_namespace_is_not_polled(
    standin: Callable[..., Standin], tmp_path: Path
) -> None:
    """Another user's server in its own network namespace (created by root, the listener
    run as `nobody`) listens on the port where a different service listens in the
    agent's namespace: asking that host:port would reach the other service."""
    victim = standin("--kind", "sglang")
    with shared_tmp() as shared:
        ready = shared / "ready"
        listen = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {victim.port})); "
                  f"s.listen(); open({str(ready)!r}, 'w').write('1'); time.sleep(120)")  # fmt: skip
        inner = f"ip link set lo up && exec {' '.join(NOBODY)} /usr/bin/python3 -c {shlex.quote(listen)}"
        netns = subprocess.Popen(["unshare", "--net", "--fork", "sh", "-c", inner])
        try:
            wait_for(lambda: ready.exists() and ready.read_text().strip(), 20, "the server")
            server = next(
                pid for pid in (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
                if cmdline(pid).startswith("/usr/bin/python3") and str(ready) in cmdline(pid)
            )  # fmt: skip
            assert listeners(server)  # it does listen, on the victim's port, in its namespace
            endpoint, why = verified_endpoint(server, victim.port)
            assert endpoint is None
            assert "another network namespace" in why and why.endswith("not polled")
            processes = [{"pid": server, "server": {"kind": "vllm", "port": victim.port}}]
            poller = ServerPoller()
            try:
                attach_state(processes, poller, wait_first=2.0)
            finally:
                poller.close()
            assert processes[0]["server"]["polled"] is False
            assert "another network namespace" in str(processes[0]["server"])
        finally:
            netns.kill()
            netns.wait()
    assert victim.requests == []
