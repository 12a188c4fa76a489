"""Whether something accepts a TCP connection at each of many addresses, all at once.

The console probes the addresses of an AReaL job's name-resolve records to tell a live
worker from a stale record; a node's agent probes those the console cannot reach (op
`tcp_probe`). Standard library only (the node side runs on Python 3.9).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time

PROBE_TIMEOUT = 2.0
PROBE_BATCH = 256  # sockets open at once
# Addresses probed per call: an AReaL job has a few thousand workers at most, and a
# backend anyone may write (etcd, Ray's KV) could hold 100,000 records (13 minutes of
# 2 s batches); the rest are answered "not probed".
MAX_PROBED = 2048


def probe_addresses(
    addresses: list[tuple[str, int]], timeout: float = PROBE_TIMEOUT
) -> dict[tuple[str, int], str | None]:
    """address -> None when something accepts a TCP connection there, else why not. All
    addresses are tried at once (non-blocking connects); the whole probe takes at most
    about `timeout` per `PROBE_BATCH` addresses."""
    out: dict[tuple[str, int], str | None] = {}
    unique = list(dict.fromkeys(addresses))
    for addr in unique[MAX_PROBED:]:
        out[addr] = f"{_show(addr)}: not probed (over {MAX_PROBED} addresses)"
    unique = unique[:MAX_PROBED]
    for start in range(0, len(unique), PROBE_BATCH):
        out.update(_probe_batch(unique[start : start + PROBE_BATCH], timeout))
    return out


def _probe_batch(batch: list[tuple[str, int]], timeout: float) -> dict[tuple[str, int], str | None]:
    out: dict[tuple[str, int], str | None] = {}
    sel = selectors.DefaultSelector()
    try:
        for addr in batch:
            host, port = addr
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:  # no IPv6 here, out of descriptors
                out[addr] = f"{_show(addr)}: {exc.strerror or exc}"
                continue
            sock.setblocking(False)
            try:
                code = sock.connect_ex((host, port))
            except OSError as exc:  # a host name that does not resolve
                code, why = -1, f"{_show(addr)}: {exc.strerror or exc}"
            if code == -1:
                out[addr] = why
                sock.close()
            elif code in (0, errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, addr)
            else:
                out[addr] = _why(code, addr)
                sock.close()
        deadline = time.monotonic() + timeout
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                code = ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                out[key.data] = None if code == 0 else _why(code, key.data)
                sel.unregister(ready)
                ready.close()
        for key in list(sel.get_map().values()):
            out[key.data] = f"no answer from {_show(key.data)} in {timeout:g}s"
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
    finally:
        for key in list(sel.get_map().values()):  # left by an error: never leak a socket
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return out


def _show(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(code: int, addr: tuple[str, int]) -> str:
    if code == errno.ECONNREFUSED:
        return f"nothing listens on {_show(addr)}: the worker is gone"
    return f"{_show(addr)}: {os.strerror(code)}"
