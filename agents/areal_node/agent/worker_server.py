"""Stacks from a rank's own worker server, where py-spy cannot attach (no CAP_SYS_PTRACE,
Yama, seccomp, py-spy missing).

torch runs a small HTTP server in a rank's process (`_WorkerServer`) whose
`dump_traceback` handler answers, from a C++ thread, every Python thread's stack as
`faulthandler` writes it: no ptrace, nothing stopped. A rank serves one when

- our launch hook started it: `areal-fr-<pid>.sock` (agents/areal_node/fr_hook);
- the job wraps its main in `torch.distributed.elastic.control_plane.worker_main()` with
  `TORCH_WORKER_SERVER_SOCKET` set (torch 2.13: torch/distributed/elastic/control_plane.py:49-51);
- it called `torch.distributed.debug.start_debug_server()`, which binds a TCP port on
  every address (`_WorkerServer("::", worker_port)`, torch/distributed/debug/__init__.py:90)
  and writes `http://<hostname>:<port>` under `rank<RANK>` in the job's TCPStore through a
  `PrefixStore("debug_server", ...)` (__init__.py:93, _store.py:14-24).

A Unix socket is asked only if the rank's own process listens on it (flight_recorder.py's
`fr_sockets`); a TCP port only if the store names it and the rank's own process listens
on it in the agent's network namespace, and then at loopback, never at the host the store
names. Every exchange has a deadline (at most `MAX_DEADLINE` per rank) and a size cap: a
rank whose server does not answer (its GIL held by a thread in a C call) is cut and named.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

from areal_node.agent.flight_recorder import fr_sockets, process_uid
from areal_node.agent.procfs import parse_environ, read_all, to_int
from areal_node.agent.rank_socket import peer_problem, recv_until_closed, remaining

MAX_DEADLINE = 3.0  # seconds one rank's worker server may take, store lookup included
MAX_TRACEBACK = 4 << 20  # bytes of one answer (faulthandler writes at most 100 x 100 frames)
MAX_THREADS = 256
MAX_FRAMES = 256  # per thread
MAX_STORE_VALUE = 4096  # bytes of the store's `rank<N>` value (a URL)
HANDLER = "/handler/dump_traceback"
NONE_FOUND = (
    "none found (the launch hook, TORCH_WORKER_SERVER_SOCKET or start_debug_server: "
    "docs/guide/stacks.md)"
)
WS_ENV = (
    "RANK", "MASTER_ADDR", "MASTER_PORT", "AREAL_FR_SOCKET_DIR", "TMPDIR",
    "TORCH_WORKER_SERVER_SOCKET",
)  # fmt: skip

# torch's TCPStore wire protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp: the
# magic number and `QueryType`, VALIDATE = 0, GET = 3, CHECK = 5; TCPStore.cpp prefixes
# every key with "/"; sizes are native 64-bit, strings length-prefixed).
STORE_MAGIC = 0x3C85F7CE
STORE_VALIDATE, STORE_GET, STORE_CHECK = 0, 3, 5
STORE_READY = 0
DEBUG_PREFIX = "debug_server"


class WorkerServerError(Exception):
    """Why a rank's worker server gave no stack; `reason` as py-spy's (timeout, ...)."""

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


def parse_traceback(text: str) -> list[dict[str, Any]]:
    """`faulthandler`'s all-threads dump as py-spy `dump --json` threads (frames leaf
    first). CPython lists the newest thread first, so the main thread is the last one
    (Python/pystate.c adds each new thread at the head of the interpreter's list). The
    block of the thread that wrote the dump (the server's own, `<no Python frame>`) is
    dropped. Lines that are not a header or a frame are skipped; sizes are capped."""
    threads: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith(("Thread 0x", "Current thread 0x")) and line.endswith(":"):
            if len(threads) >= MAX_THREADS:
                break
            ident = line.split("0x", 1)[1].split(" ", 1)[0]
            try:
                tid = int(ident, 16)
            except ValueError:
                tid = 0
            current = {
                "thread_id": tid,
                "thread_name": f"Thread 0x{ident[:16]}",
                "frames": [],
                "current": line.startswith("Current"),
            }
            threads.append(current)
        elif line.startswith("Stack (most recent call first)") and current is None:
            current = {"thread_id": 0, "thread_name": "", "frames": [], "current": False}
            threads.append(current)
        elif line.startswith('  File "') and current is not None:
            frame = _frame(line[len('  File "') :])
            if frame is not None and len(current["frames"]) < MAX_FRAMES:
                current["frames"].append(frame)
    kept = [t for t in threads if t["frames"] or not t["current"]]
    for t in kept:
        del t["current"]
    if kept:
        kept[-1]["thread_name"] = "MainThread"
    return kept


def _frame(rest: str) -> dict[str, Any] | None:
    """`<file>", line <n> in <function>` as a py-spy frame, else None."""
    path, sep, tail = rest.rpartition('", line ')
    if not sep:
        return None
    number, sep, function = tail.partition(" in ")
    if not sep:
        return None
    path, function = path[:4096], function[:1024]
    return {
        "name": function,
        "filename": path,
        "short_filename": os.path.basename(path),
        "line": int(number) if number.isdigit() and len(number) < 10 else 0,
    }


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    data = b""
    while len(data) < size:
        sock.settimeout(remaining(deadline))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise WorkerServerError("the store closed the connection")
        data += chunk
    return data


def post(
    endpoint: tuple[Any, ...], path: str, deadline: float, uid: int, pid: int | None = None
) -> bytes:
    """POST `path` (an HTTP/1.0 request: the server closes after one answer) at a Unix
    socket ("unix", path) whose listener must run as `uid` and be process `pid`
    (SO_PEERCRED, checked before a byte is sent), or a TCP ("tcp", host, port); the body
    of a 200 answer, else WorkerServerError. The whole exchange ends by `deadline`."""
    from areal_node.server_poll import parse_http

    if endpoint[0] == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: Any = endpoint[1]
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in endpoint[1] else socket.AF_INET)
        target = (endpoint[1], endpoint[2])
    try:
        sock.settimeout(remaining(deadline))
        sock.connect(target)
        if endpoint[0] == "unix":
            problem = peer_problem(sock, uid, pid)
            if problem is not None:
                raise WorkerServerError(problem)
        request = f"POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
        sock.sendall(request.encode())
        data = recv_until_closed(sock, deadline, MAX_TRACEBACK)
        if len(data) > MAX_TRACEBACK:
            raise WorkerServerError(f"answer over {MAX_TRACEBACK} bytes: not read", "malformed")
        answer = parse_http(data)
    finally:
        sock.close()
    if answer.error is not None:
        raise WorkerServerError(answer.error, "malformed" if answer.status is None else "error")
    return answer.body


def store_get(host: str, port: int, key: str, deadline: float) -> str | None:
    """The value of `key` in the TCPStore at host:port (None: not set), asked with CHECK
    first so that a missing key is never waited for; bounded in time and size."""
    wire = ("/" + key).encode()
    with socket.create_connection((host, port), timeout=remaining(deadline)) as sock:
        sock.sendall(struct.pack("<BI", STORE_VALIDATE, STORE_MAGIC))
        sock.sendall(struct.pack("<BQQ", STORE_CHECK, 1, len(wire)) + wire)
        if _recv_exact(sock, 1, deadline)[0] != STORE_READY:
            return None
        sock.sendall(struct.pack("<BQ", STORE_GET, len(wire)) + wire)
        (size,) = struct.unpack("<Q", _recv_exact(sock, 8, deadline))
        if size > MAX_STORE_VALUE:
            raise WorkerServerError(f"the store's value is {size} bytes: not a worker address")
        return _recv_exact(sock, size, deadline).decode("utf-8", "replace")


def descriptors_hidden(pid: int) -> bool:
    """Whether the process's open files cannot be told (`/proc/PID/fd` links of another
    user's process need CAP_SYS_PTRACE; the directory itself lists)."""
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                os.readlink(f"/proc/{pid}/fd/{name}")
            except FileNotFoundError:
                continue  # closed meanwhile
            return False
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def user_listeners(pid: int, uid: int) -> list[Any]:
    """TCP sockets listening in `pid`'s network namespace that belong to user `uid` (the
    owner column of /proc/PID/net/tcp{,6}) and that the agent's own namespace lists too
    (same inode: one namespace, so loopback reaches them). For another user's process
    without CAP_SYS_PTRACE, whose descriptors cannot be read: the rank's user, not the
    rank itself, is what can be checked."""
    from areal_node.server_poll import LISTEN, parse_net_table, tcp_tables

    def inodes(text: str, owner: int | None) -> set[str]:
        found = set()
        for line in text.splitlines():
            cols = line.split()
            listening = len(cols) >= 10 and cols[3] == LISTEN and cols[7].isdigit()
            if listening and (owner is None or int(cols[7]) == owner):
                found.add(cols[9])
        return found

    theirs = tcp_tables(pid)
    shared = inodes(theirs, uid) & inodes(tcp_tables("self"), None)
    return parse_net_table(theirs, shared) if shared else []


def debug_server_endpoint(
    pid: int, env: dict[str, str], deadline: float
) -> tuple[tuple[Any, ...] | None, str]:
    """("tcp", host, port) of the debug server's worker port of rank `pid`, or None and
    why not ("" when the rank shows no sign of one)."""
    from areal_node.server_poll import listeners

    rank, store_port = to_int(env.get("RANK")), to_int(env.get("MASTER_PORT"))
    store_host = env.get("MASTER_ADDR") or ""
    if rank is None or store_port is None or not store_host:
        return None, ""
    try:
        own = listeners(pid)
        if not own and descriptors_hidden(pid):
            raise PermissionError(f"/proc/{pid}/fd")
        try:
            same_namespace = os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
        except OSError:
            same_namespace = False
        if own and not same_namespace:
            return None, "its TCP ports are in another network namespace: not asked"
    except PermissionError:  # another user's process, no CAP_SYS_PTRACE: its user's ports
        try:
            own = user_listeners(pid, process_uid(pid))
        except OSError:
            return None, ""
    except OSError:
        return None, ""
    # The debug server binds every address (`_WorkerServer("::", worker_port)`); gloo's and
    # NCCL's own listeners bind one: only a rank with a wildcard port besides the store's
    # makes the agent read the store.
    mine = [lst for lst in own if lst.port != store_port and lst.bound in ("::", "0.0.0.0")]
    if not mine:
        return None, ""  # no such port: no debug server
    try:
        value = store_get(store_host, store_port, f"{DEBUG_PREFIX}/rank{rank}", deadline)
    except (OSError, WorkerServerError, struct.error) as exc:
        return None, f"the job's store at {store_host}:{store_port} not read: {exc}"[:300]
    if value is None:
        return None, ""
    port = to_int(value.rpartition(":")[2].split("/", 1)[0])
    on_port = [lst for lst in mine if lst.port == port]
    if not on_port:
        return None, f"the store names port {port}, which the rank does not listen on: not asked"
    on_port.sort(key=lambda lst: ":" in lst.host)  # a wildcard bind answers on 127.0.0.1
    return ("tcp", on_port[0].host, on_port[0].port), ""


def _where(endpoint: tuple[Any, ...]) -> str:
    if endpoint[0] == "unix":
        return str(endpoint[1])
    host = f"[{endpoint[1]}]" if ":" in endpoint[1] else endpoint[1]
    return f"{host}:{endpoint[2]}"


def worker_stacks(pid: int, timeout: float = MAX_DEADLINE) -> dict[str, Any]:
    """A py-spy-shaped dump record of rank `pid` from its worker server: `{"pid", "ok",
    "threads", "source": "worker_server", "endpoint"}`, or `ok` False with `reason` and
    `error`. Never raises; returns within `timeout` (at most MAX_DEADLINE) seconds."""
    deadline = time.monotonic() + min(timeout, MAX_DEADLINE)
    record: dict[str, Any] = {"pid": pid, "requested_pid": pid, "source": "worker_server"}
    try:
        uid = process_uid(pid)
        env = parse_environ(read_all(f"/proc/{pid}/environ"), WS_ENV)
    except FileNotFoundError:
        return {**record, "ok": False, "reason": "gone", "error": f"process {pid} exited"}
    except OSError as exc:
        why = f"its environment cannot be read ({exc.strerror or exc})"
        return {**record, "ok": False, "reason": "error", "error": f"no worker server: {why}"}
    endpoints: list[tuple[Any, ...]] = [("unix", p) for p in fr_sockets(pid, env)]
    notes = []
    if not endpoints:
        tcp, why = debug_server_endpoint(pid, env, deadline)
        if tcp is not None:
            endpoints.append(tcp)
        elif why:
            notes.append(why)
    if not endpoints:
        why = "; ".join(notes) or NONE_FOUND
        return {**record, "ok": False, "reason": "no_server", "error": f"no worker server: {why}"}
    errors = []
    for endpoint in endpoints:
        where = _where(endpoint)
        try:
            body = post(endpoint, HANDLER, deadline, uid, pid)
        except (socket.timeout, TimeoutError):
            budget = min(timeout, MAX_DEADLINE)
            return {
                **record, "ok": False, "reason": "timeout", "endpoint": where,
                "error": f"worker server at {where} gave no stack within {budget:g}s "
                "(its GIL is held: a thread in a long C call?)",
            }  # fmt: skip
        except WorkerServerError as exc:
            errors.append(f"{where}: {exc}")
            continue
        except OSError as exc:
            errors.append(f"{where}: {type(exc).__name__}: {exc.strerror or exc}"[:300])
            continue
        threads = parse_traceback(body.decode("utf-8", "replace"))
        if not threads:
            errors.append(f"{where}: the answer holds no Python stack")
            continue
        return {**record, "ok": True, "threads": threads, "endpoint": where}
    return {
        **record,
        "ok": False,
        "reason": "error",
        "error": "worker server: " + "; ".join(errors),
    }
