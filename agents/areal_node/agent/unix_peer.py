"""Who answers at the other end of a Unix socket: the listener's own credentials
(`SO_PEERCRED`, which the kernel records when the listener called `listen`), read after
`connect` and before a byte is sent. A rank's worker server, asked for a trace or a stack,
must run as the rank's user and, where the rank is known, be that very process: a socket
another user bound under a name the rank would use is never written to."""

from __future__ import annotations

import socket
import struct

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


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
