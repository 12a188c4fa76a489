"""Asking a rank's own server over a socket (its worker server, NCCL's RAS port): who
answers, and reading the answer within a deadline and a size bound.

Who answers at a Unix socket is the listener's own credentials (`SO_PEERCRED`, which the
kernel records when the listener called `listen`), read after `connect` and before a byte
is sent: the server must run as the rank's user and, where the rank is known, be that
very process; a socket another user bound under a name the rank would use is never
written to. An answer is read to one deadline for the whole exchange (a server that
trickles runs out of time, not a per-read timeout) and to a byte bound."""

from __future__ import annotations

import socket
import struct
import time

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CHUNK = 1 << 16


def peer_problem(sock: socket.socket, uid: int, pid: int | None = None) -> str | None:
    """Why the listener at the other end of the connected Unix socket `sock` is not the
    rank (run by `uid`; with `pid`, that process), or None when it is."""
    peer_pid, peer_uid, _ = _CREDS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    )
    if peer_uid != uid:
        return f"served by uid {peer_uid}, not the rank's uid {uid}"
    if pid is not None and peer_pid != pid:
        return f"served by process {peer_pid}, not the rank ({pid})"
    return None


def remaining(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic()); socket.timeout once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("deadline passed")
    return left


def recv_until_closed(sock: socket.socket, deadline: float, limit: int) -> bytes:
    """What the peer sends until it closes the connection, by `deadline`; reading stops
    once more than `limit` bytes came (the caller refuses an answer longer than `limit`)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        sock.settimeout(remaining(deadline))
        data = sock.recv(_CHUNK)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)
