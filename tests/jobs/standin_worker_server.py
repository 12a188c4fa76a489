"""A stand-in for torch's per-rank worker server on a Unix socket, answering
`POST /handler/dump_traceback` well or badly (standard library only: runs as any user).

    python tests/jobs/standin_worker_server.py MODE DIR [FOR_PID]

It listens at DIR/areal-fr-<FOR_PID or its own pid>.sock (the launch hook's name), writes
DIR/ready-<pid> once it does, and appends every request it receives to DIR/got-<pid>.
MODE: ok (a recorded real answer), garbage, huge (8 MiB), trickle (a byte every 0.2 s),
silent (accepts, never answers).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "data/worker_server/dump_traceback_threads.txt"


def answer(mode: str) -> bytes:
    if mode == "ok":
        body = RECORDED.read_bytes()
    elif mode == "garbage":
        body = bytes(range(256)) * 64
    else:  # huge
        body = b"Thread 0x1 (most recent call first):\n" + b'  File "x", line 1 in f\n' * 400_000
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def serve(conn: socket.socket, mode: str, log: Path) -> None:
    with conn:
        got = conn.recv(4096)
        with open(log, "ab") as fh:
            fh.write(got)
        if mode == "silent":
            time.sleep(60)
        elif mode == "trickle":
            for byte in b"HTTP/1.1 200 OK\r\n\r\n" * 100:
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        else:
            conn.sendall(answer(mode))


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    owner = int(sys.argv[3]) if len(sys.argv) > 3 else os.getpid()
    path = directory / f"areal-fr-{owner}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    (directory / f"ready-{os.getpid()}").write_text(str(path))
    log = directory / f"got-{os.getpid()}"
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, mode, log), daemon=True).start()


if __name__ == "__main__":
    main()
