"""Polling inference servers on this node: which address to ask, and asking with bounds.

A server is polled only at a host:port its own process listens on, read from /proc: the
process's socket inodes (`/proc/PID/fd` links `socket:[INODE]`) matched with the LISTEN
rows of `/proc/PID/net/tcp` and `tcp6`. The command line only says which of those ports
is the HTTP one (`--port`, else the server's default); a port the process does not
listen on is never asked, and the host asked is the address from /proc (a wildcard
becomes loopback), never text from the command line.

Each request has a connect timeout, an overall deadline and a size cap; each server has
at most one poll in flight; a fixed pool of daemon threads does the polling, so a slow
or hostile server costs one worker for one deadline, and `nodes` never waits for it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from areal_node.agent.procfs import read_fd
from areal_node.prom_text import decode_body, parse_exposition
from areal_node.server_flags import ServerPoint, flags_json, server_flags, throughput_from_counter

MAX_FDS = 65536  # fd entries looked at per process
MAX_NET_TABLE = 8 << 20  # bytes of /proc/PID/net/tcp{,6} read
MAX_ANSWER = 4 << 20  # bytes of one HTTP answer (headers and body)
MAX_HEADERS = 16 << 10
CONNECT_TIMEOUT = 1.0
POLL_DEADLINE = 2.0  # one server's whole poll (every route)
POLL_INTERVAL = 3.0  # a server is asked again this long after its last poll ended (as /health was)
HISTORY = 120  # polls kept per server (throughput sparkline, medians)
WORKERS = 8

# What each kind answers (docs/design/areal.md cites the routes): SGLang's Prometheus metrics and
# model info (its `weight_version`), vLLM's metrics and its engine's pause state
# (`GET /is_paused`, served only with VLLM_SERVER_DEV_MODE=1: a 404 is no error), AReaL
# v2's data proxy's health (paused, version).
ROUTES = {
    "sglang": ("/metrics", "/model_info"),
    "vllm": ("/metrics", "/is_paused"),
    "data_proxy": ("/health",),
}
OPTIONAL = {"/is_paused"}  # a 404 there means "not served", not a failed poll
# Why a server's pause state is not known (`paused: null`, `paused_note` in nodes --json).
PAUSE_UNKNOWN = {
    "sglang": "SGLang serves no route that reports its pause state (its pause routes "
    "are POST only)",
    "vllm": "vLLM reports it at GET /is_paused only when started with "
    "VLLM_SERVER_DEV_MODE=1 (AReaL's pause routes are POST only)",
    "data_proxy": "the data proxy's /health carried no paused field",
}
LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    host: str  # the address to connect to (a wildcard bind becomes loopback)
    port: int
    bound: str  # the address as bound


@dataclass
class HttpAnswer:
    status: int | None = None
    body: bytes = b""
    error: str | None = None


def _socket_inodes(pid: int, proc_root: str) -> set[str]:
    inodes = set()
    fd_dir = f"{proc_root}/{pid}/fd"
    with os.scandir(fd_dir) as entries:
        for n, entry in enumerate(entries):
            if n >= MAX_FDS:
                break
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(target[8:-1])
    return inodes


def _decode_address(text: str) -> str | None:
    """The hex address of a /proc/net/tcp row (32-bit words in host order)."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def parse_net_table(text: str, inodes: set[str]) -> list[Listener]:
    """LISTEN rows of a /proc/net/tcp{,6} table whose inode is in `inodes`."""
    found = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != LISTEN or cols[9] not in inodes:
            continue
        addr, _, port_hex = cols[1].partition(":")
        bound = _decode_address(addr)
        try:
            port = int(port_hex, 16)
        except ValueError:
            continue
        if bound is None or not 0 < port < 65536:
            continue
        ip = ipaddress.ip_address(bound)
        if ip.is_unspecified:
            host = "127.0.0.1" if ip.version == 4 else "::1"
        elif getattr(ip, "ipv4_mapped", None) is not None:
            host = str(ip.ipv4_mapped)  # type: ignore[union-attr]
        else:
            host = bound
        found.append(Listener(host, port, bound))
    return found


def tcp_tables(pid: int | str, proc_root: str = "/proc") -> str:
    """The TCP tables (`tcp`, then `tcp6`) of the network namespace process `pid` (or
    "self") is in, each read to MAX_NET_TABLE; a table the kernel lacks is left out."""
    text = ""
    for table in ("tcp", "tcp6"):
        try:
            fd = os.open(f"{proc_root}/{pid}/net/{table}", os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        try:
            text += read_fd(fd, MAX_NET_TABLE).decode("ascii", "replace")
        finally:
            os.close(fd)
    return text


def listeners(pid: int, proc_root: str = "/proc") -> list[Listener]:
    """TCP sockets the process itself listens on (OSError: its /proc cannot be read)."""
    inodes = _socket_inodes(pid, proc_root)
    if not inodes:
        return []
    return parse_net_table(tcp_tables(pid, proc_root), inodes)


def verified_endpoint(pid: int, port: int, proc_root: str = "/proc") -> tuple[Listener | None, str]:
    """The listener of `pid` on `port` to poll, or None and why not."""
    try:
        mine = listeners(pid, proc_root)
    except PermissionError:
        return None, "its sockets cannot be read (/proc/PID/fd): not polled"
    except OSError as exc:
        return None, f"its sockets cannot be read ({exc.strerror or exc}): not polled"
    on_port = [lst for lst in mine if lst.port == port]
    if not on_port:
        ports = ", ".join(str(p) for p in sorted({lst.port for lst in mine})[:8]) or "none"
        return (
            None,
            f"the process does not listen on port {port} (it listens on: {ports}): not polled",
        )
    # The address is read from the process's own /proc/PID/net tables, which are its
    # network namespace's: from another namespace, the same host:port is someone else's
    # service in the agent's (as the Flight Recorder path, it is compared).
    theirs, ours = _net_namespace(f"{proc_root}/{pid}/ns/net"), _net_namespace("/proc/self/ns/net")
    if theirs is None or ours is None:
        return None, "its network namespace cannot be read: not polled"
    if theirs != ours:
        return (
            None,
            f"it listens in another network namespace ({theirs}; the agent's is {ours}): "
            "not polled",
        )
    # Prefer an IPv4 listener: the agent's loopback is where a wildcard bind answers.
    on_port.sort(key=lambda lst: ":" in lst.host)
    return on_port[0], ""


def _net_namespace(link: str) -> str | None:
    try:
        return os.readlink(link)
    except OSError:
        return None


def http_get(
    host: str,
    port: int,
    path: str,
    deadline: float,
    max_bytes: int = MAX_ANSWER,
) -> HttpAnswer:
    """GET with an absolute (monotonic) deadline, a connect timeout and a size cap; an
    HTTP/1.0 request, so the server closes after one answer (no chunking, no keep-alive)."""
    started = time.monotonic()
    remaining = deadline - started
    if remaining <= 0:
        return HttpAnswer(error="no time left for this request")
    shown = f"[{host}]" if ":" in host else host
    request = f"GET {path} HTTP/1.0\r\nHost: {shown}:{port}\r\nAccept: */*\r\n\r\n".encode()
    chunks: list[bytes] = []
    size = 0
    try:
        with socket.create_connection(
            (host, port), timeout=min(CONNECT_TIMEOUT, remaining)
        ) as sock:
            sock.sendall(request)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return HttpAnswer(error=f"no complete answer within {deadline - started:.1f}s")
                sock.settimeout(left)
                data = sock.recv(1 << 18)
                if not data:
                    break
                size += len(data)
                if size > max_bytes:
                    return HttpAnswer(error=f"answer over {max_bytes} bytes: not read")
                chunks.append(data)
    except TimeoutError:
        return HttpAnswer(error=f"no complete answer within {deadline - started:.1f}s")
    except ConnectionRefusedError:
        return HttpAnswer(error="connection refused")
    except OSError as exc:
        return HttpAnswer(error=f"{type(exc).__name__}: {exc.strerror or exc}"[:200])
    return parse_http(b"".join(chunks))


def parse_http(raw: bytes) -> HttpAnswer:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or len(head) > MAX_HEADERS:
        return HttpAnswer(error="malformed HTTP answer (no header end)")
    lines = head.split(b"\r\n")
    status_line = lines[0].split(None, 2)
    if (
        len(status_line) < 2
        or not status_line[0].startswith(b"HTTP/")
        or not status_line[1].isdigit()
    ):
        return HttpAnswer(error="malformed HTTP status line")
    status = int(status_line[1])
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return HttpAnswer(status, error="malformed Content-Length")
            if len(body) < length:
                return HttpAnswer(status, error=f"answer truncated ({len(body)} of {length} bytes)")
            body = body[:length]
        elif name == b"transfer-encoding" and value.strip().lower() != b"identity":
            return HttpAnswer(status, error="unexpected transfer encoding for an HTTP/1.0 request")
    if status != 200:
        return HttpAnswer(status, error=f"HTTP {status}")
    return HttpAnswer(status, body)


def _json_object(body: bytes) -> dict[str, Any] | None:
    if len(body) > 1 << 20:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _version(value: Any) -> int | str | None:
    if isinstance(value, bool) or value is None:
        return None
    # A version counts up from 0: a negative or huge one is no version (it would raise
    # a lag flag of its own); "²" is a digit to isdigit() but no number to int().
    if isinstance(value, int):
        return value if 0 <= value < 1 << 53 else None
    if isinstance(value, str) and value:
        text = value[:64]
        return int(text) if text.isascii() and text.isdigit() and len(text) < 16 else text
    return None


def poll_server(
    kind: str, host: str, port: int, deadline_s: float = POLL_DEADLINE
) -> dict[str, Any]:
    """Every route of one server within one deadline: metrics, version, pause state."""
    deadline = time.monotonic() + deadline_s
    out: dict[str, Any] = {"ok": True, "errors": {}}
    for path in ROUTES.get(kind, ()):
        answer = http_get(host, port, path, deadline)
        if answer.status == 404 and path in OPTIONAL:
            continue
        if answer.error is not None:
            out["ok"] = False
            out["errors"][path] = answer.error
            continue
        if path == "/metrics":
            parsed = parse_exposition(decode_body(answer.body))
            out["metrics"] = parsed.values()
            if parsed.malformed:
                out["errors"][path] = f"{parsed.malformed} malformed lines skipped"
        elif path == "/model_info":
            doc = _json_object(answer.body)
            if doc is None:
                out["ok"] = False
                out["errors"][path] = "not a JSON object"
            else:
                out["weight_version"] = _version(doc.get("weight_version"))
        elif path == "/is_paused":
            doc = _json_object(answer.body)
            paused = doc.get("is_paused") if doc is not None else None
            out["paused"] = paused if isinstance(paused, bool) else None
            if doc is None:
                out["errors"][path] = "not a JSON object"
        elif path == "/health":
            doc = _json_object(answer.body)
            if doc is None:
                out["ok"] = False
                out["errors"][path] = "not a JSON object"
            else:
                paused = doc.get("paused")
                out["paused"] = paused if isinstance(paused, bool) else None
                out["weight_version"] = _version(doc.get("version"))
    return out


@dataclass
class ServerRecord:
    kind: str
    host: str
    port: int
    history: deque[ServerPoint] = field(default_factory=lambda: deque(maxlen=HISTORY))
    last: dict[str, Any] | None = None
    in_flight: bool = False
    next_at: float = 0.0


class ServerPoller:
    """Polls servers in the background: `state()` answers at once from the latest polls,
    and schedules a poll of each server whose last one ended POLL_INTERVAL ago."""

    def __init__(self, workers: int = WORKERS, interval: float = POLL_INTERVAL) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._polled = threading.Condition(self._lock)  # notified after each poll
        self._servers: dict[str, ServerRecord] = {}
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name="server-poll", daemon=True)
            for _ in range(workers)
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            with self._lock:
                rec = self._servers.get(key)
            if rec is None:
                continue
            try:
                result = poll_server(rec.kind, rec.host, rec.port)
            except Exception as exc:  # a bug here must not kill the worker
                result = {"ok": False, "errors": {"poll": f"{type(exc).__name__}: {exc}"[:200]}}
            now = time.time()
            with self._lock:
                prev = rec.history[-1] if rec.history else None
                point = ServerPoint(
                    now,
                    dict(result.get("metrics") or {}),
                    paused=result.get("paused"),
                    weight_version=result.get("weight_version"),
                )
                gen = point.metrics.get("sglang:gen_throughput")
                point.throughput = gen if gen is not None else throughput_from_counter(prev, point)
                rec.history.append(point)
                rec.last = dict(result, checked_at=now)
                rec.in_flight = False
                rec.next_at = time.monotonic() + self.interval
                self._polled.notify_all()

    def state(self, targets: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, Any]]:
        """The latest state of each (kind, host, port); polls are scheduled, never awaited."""
        now = time.monotonic()
        out = {}
        with self._lock:
            wanted = set()
            for kind, host, port in targets:
                key = f"{kind}|{host}|{port}"
                wanted.add(key)
                rec = self._servers.get(key)
                if rec is None:
                    rec = self._servers[key] = ServerRecord(kind, host, port)
                if not rec.in_flight and now >= rec.next_at:
                    rec.in_flight = True
                    self._queue.put(key)
                out[key] = self._describe(rec)
            for key in set(self._servers) - wanted:
                if not self._servers[key].in_flight:
                    del self._servers[key]  # the server is gone
        return out

    def wait_first(self, targets: Iterable[tuple[str, str, int]], timeout: float) -> None:
        """Wait (at most `timeout`) until each target has been polled once: a one-shot
        `nodes` then shows a first answer, as the `/health` poll always did."""
        keys = [f"{kind}|{host}|{port}" for kind, host, port in targets]
        deadline = time.monotonic() + timeout
        with self._polled:
            while True:
                pending = [k for k in keys if k in self._servers and self._servers[k].last is None]
                left = deadline - time.monotonic()
                if not pending or left <= 0:
                    return
                self._polled.wait(left)

    @staticmethod
    def _describe(rec: ServerRecord) -> dict[str, Any]:
        last = rec.last
        if last is None:
            return {
                "polled": False,
                "metrics": {},
                "weight_version": None,
                "paused": None,
                "throughput": [],
                "flags": [],
            }
        history = list(rec.history)
        return {
            "polled": True,
            "ok": last.get("ok"),
            "errors": last.get("errors") or {},
            "checked_at": last.get("checked_at"),
            "metrics": dict(last.get("metrics") or {}),
            "weight_version": last.get("weight_version"),
            "paused": last.get("paused"),
            "paused_note": PAUSE_UNKNOWN.get(rec.kind) if last.get("paused") is None else None,
            "throughput": [
                round(p.throughput, 1) for p in history[-30:] if p.throughput is not None
            ],
            "flags": flags_json(server_flags(history)),
        }


def attach_state(
    records: list[dict[str, Any]],
    poller: ServerPoller,
    verify: Callable[[int, int], tuple[Listener | None, str]] = verified_endpoint,
    wait_first: float = 0.0,
) -> dict[int, Listener]:
    """Put each server process's polled state under its `server` record (`nodes --json`):
    `polled`, `metrics`, `weight_version`, `paused`, `throughput`, `flags`, and
    `poll_error` when it is not polled (the reason: no verified listening port). Returns
    the verified listener of each polled server record, by `id()` of the record. With
    `wait_first`, servers never polled before are waited for (at most that long)."""
    targets: list[tuple[str, str, int]] = []
    keyed: list[tuple[dict[str, Any], str]] = []
    verified: dict[int, Listener] = {}
    for rec in records:
        srv = rec.get("server")
        if not isinstance(srv, dict) or srv.get("kind") not in ROUTES:
            continue
        port = srv.get("port")
        if type(port) is not int or not 0 < port < 65536:
            srv.update(polled=False, poll_error="no port to poll")
            continue
        endpoint, why = verify(int(rec["pid"]), port)
        if endpoint is None:
            srv.update(polled=False, poll_error=why)
            continue
        verified[id(srv)] = endpoint
        target = (str(srv["kind"]), endpoint.host, endpoint.port)
        targets.append(target)
        keyed.append((srv, "|".join(map(str, target))))
    states = poller.state(targets)
    new = [t for t, (_, key) in zip(targets, keyed) if not states[key].get("polled")]
    if new and wait_first > 0:
        poller.wait_first(new, wait_first)
        states = poller.state(targets)
    for srv, key in keyed:
        srv.update(states.get(key, {"polled": False}))
    return verified
