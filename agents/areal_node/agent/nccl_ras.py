"""NCCL's RAS (reliability, availability, serviceability) status, where a job's NCCL
serves it: NCCL >= 2.24 runs a RAS thread in every process, listening at `localhost:28028`
(or `NCCL_RAS_ADDR`; every process of the node binds it with SO_REUSEPORT, which the
kernel allows only to one user) and answering the `ncclras` client's line protocol
(NVIDIA/nccl v2.28.7-1, src/ras/client_support.cc:354-414; client side src/ras/client.cc:
201-323):

    -> CLIENT PROTOCOL 2          <- SERVER PROTOCOL 2
    -> TIMEOUT <seconds>          <- OK                (how long it gathers from peers)
    -> SET FORMAT json            <- OK                (2.28.7 on; older: ERROR: Unknown command)
    -> VERBOSE STATUS             <- the report, then the server closes the connection

The port is asked only where one of the job's ranks itself listens on it (its own sockets,
or, for another user's process without CAP_SYS_PTRACE, its user's: see worker_server.py),
in the agent's network namespace; the answer is bounded in time and size and relayed as
text: the console parses it (core/stacks/nccl_ras.py).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.procfs import parse_environ, read_all
from areal_node.agent.protocol import OpError, arg, op
from areal_node.agent.rank_socket import recv_until_closed, remaining

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent

RAS_PORT = 28028  # NCCL_RAS_CLIENT_PORT, src/ras/ras_internal.h:10 (v2.28.7-1)
RAS_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, ras_internal.h:11
MAX_REPORT = 8 << 20  # bytes of one status report
MAX_LINE = 4096  # bytes of a handshake answer line
GATHER_SECONDS = 3  # what NCCL may spend gathering from its peers (its TIMEOUT)


class RasError(Exception):
    """Why a RAS port gave no report."""


def ras_port(env: dict[str, str]) -> int | None:
    """The port the rank's NCCL serves RAS on: NCCL_RAS_ADDR's (`host:port`), else 28028."""
    addr = env.get("NCCL_RAS_ADDR")
    if not addr:
        return RAS_PORT
    port = addr.rpartition(":")[2]
    return int(port) if port.isdigit() and 0 < int(port) < 65536 else None


NO_NCCL = "no NCCL library in the rank's process"
MAX_MAPS = 32 << 20  # bytes of /proc/PID/maps read


def loads_nccl(pid: int) -> bool | None:
    """Whether the process has NCCL's library mapped (None: its map cannot be read, as for
    another user's process without CAP_SYS_PTRACE)."""
    from areal_node.agent.procfs import read_fd

    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY)
    except OSError:
        return None
    try:
        return b"/libnccl" in read_fd(fd, MAX_MAPS)
    except OSError:
        return None
    finally:
        os.close(fd)


def listened_on(pid: int, port: int) -> bool:
    """Whether anything listens on `port` in `pid`'s network namespace (a cheap look
    before the rank's own sockets are checked: most jobs on most nodes have no RAS)."""
    wanted = f":{port:04X} "
    for table in ("tcp", "tcp6"):
        try:
            text = read_all(f"/proc/{pid}/net/{table}").decode("ascii", "replace")
        except OSError:
            continue
        if any(wanted in line and line.split()[3:4] == ["0A"] for line in text.splitlines()):
            return True
    return False


def ras_endpoint(pid: int) -> tuple[tuple[str, int] | None, str]:
    """(host, port) to ask for rank `pid`'s RAS report, or None and why not."""
    try:
        env = parse_environ(read_all(f"/proc/{pid}/environ"), ("NCCL_RAS_ADDR", "NCCL_RAS_ENABLE"))
        if env.get("NCCL_RAS_ENABLE") == "0":
            return None, "RAS is off in this job (NCCL_RAS_ENABLE=0)"
        port = ras_port(env)
        if port is None:
            return None, f"NCCL_RAS_ADDR={env['NCCL_RAS_ADDR'][:100]!r} names no port"
        if loads_nccl(pid) is False:
            return None, NO_NCCL
        if not listened_on(pid, port):
            return None, f"nothing listens on the RAS port {port} (NCCL < 2.24, or no NCCL)"
        from areal_node.agent.worker_server import descriptors_hidden, user_listeners
        from areal_node.server_poll import listeners

        own = listeners(pid)
        if not own and descriptors_hidden(pid):
            own = user_listeners(pid, os.stat(f"/proc/{pid}").st_uid)
        else:
            try:
                theirs, mine = os.readlink(f"/proc/{pid}/ns/net"), os.readlink("/proc/self/ns/net")
            except OSError:
                theirs = mine = ""
            if theirs != mine:
                return None, "its ports are in another network namespace: not asked"
    except OSError as exc:
        return None, f"its sockets cannot be read ({exc.strerror or exc})"
    on_port = sorted((lst for lst in own if lst.port == port), key=lambda lst: ":" in lst.host)
    if not on_port:
        return None, f"the RAS port {port} is not the rank's own: not asked"
    return (on_port[0].host, on_port[0].port), ""


def _line(sock: socket.socket, deadline: float) -> str:
    data = b""
    while not data.endswith(b"\n"):
        sock.settimeout(remaining(deadline))
        chunk = sock.recv(1)
        if not chunk:
            raise RasError("the RAS port closed the connection during the handshake")
        data += chunk
        if len(data) > MAX_LINE:
            raise RasError(f"a handshake line over {MAX_LINE} bytes")
    return data.decode("utf-8", "replace").strip()


def ras_report(host: str, port: int, timeout: float, json_format: bool = True) -> dict[str, Any]:
    """One VERBOSE STATUS report: {"format": "json"|"text", "server_protocol", "report"}.
    Raises RasError (or OSError) when the port does not speak RAS, or too slowly/much."""
    deadline = time.monotonic() + timeout
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(remaining(deadline))
        sock.connect((host, port))
        sock.sendall(f"CLIENT PROTOCOL {RAS_PROTOCOL}\n".encode())
        hello = _line(sock, deadline)
        if not hello.upper().startswith("SERVER PROTOCOL "):
            raise RasError(f"not a RAS answer: {hello[:80]!r}")
        gather = max(1, min(GATHER_SECONDS, int(timeout / 2)))
        sock.sendall(f"TIMEOUT {gather}\n".encode())
        _line(sock, deadline)  # OK (an older NCCL may say ERROR: it keeps its own)
        fmt = "text"
        if json_format:
            sock.sendall(b"SET FORMAT json\n")
            fmt = "json" if _line(sock, deadline).upper() == "OK" else "text"
        sock.sendall(b"VERBOSE STATUS\n")
        report = recv_until_closed(sock, deadline, MAX_REPORT)
        if len(report) > MAX_REPORT:
            raise RasError(f"a report over {MAX_REPORT} bytes: not read")
    return {
        "format": fmt,
        "server_protocol": hello[len("SERVER PROTOCOL ") :][:20],
        "report": report.decode("utf-8", "replace"),
    }


@op("nccl_ras")
def op_nccl_ras(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """The RAS report of the first of `pids` whose NCCL serves one (one report covers
    every rank of the job: NCCL gathers it from all its peers); else why none."""
    pids = args.get("pids")
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        raise OpError("argument 'pids' must be a list of integers")
    timeout = min(arg(args, "timeout", float, 10.0), 30.0)
    reasons: dict[str, list[int]] = {}
    for pid in pids[:8]:  # every NCCL process of a node listens (SO_REUSEPORT): a few suffice
        endpoint, why = ras_endpoint(pid)
        if endpoint is None:
            reasons.setdefault(why, []).append(pid)
            if why == NO_NCCL:
                break  # the job's ranks run the same program: none of them has NCCL
            continue
        host, port = endpoint
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            return {"ok": True, "pid": pid, "address": where, **ras_report(*endpoint, timeout)}
        except (socket.timeout, TimeoutError):
            error = f"{where}: no complete answer within {timeout:g}s"
            return {"ok": False, "pid": pid, "address": where, "error": error}
        except (RasError, OSError) as exc:
            return {"ok": False, "pid": pid, "address": where, "error": f"{where}: {exc}"[:300]}
    said = "; ".join(f"{why} (pid {', '.join(map(str, p[:4]))})" for why, p in reasons.items())
    return {"ok": False, "error": f"no NCCL RAS port: {said or 'no rank asked'}"}
