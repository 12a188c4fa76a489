"""A stand-in for NCCL's RAS client port (no GPU here): the line protocol and the reports
of NVIDIA/nccl v2.28.7-1 src/ras/client_support.cc, written as that code writes them
(`rasOutAppend` calls of `jsonWriteHeader` .. `jsonWriteFooter`, 1890-1987, with the
2.28.7 missing comma after a missing rank's `nvml_dev`; the text report's mismatch
section, 1541-1631), or misbehaving.

    RANK=0 NCCL_RAS_ADDR=127.0.0.1:PORT python tests/jobs/standin_nccl_ras.py MODE DIR

It maps a file named `libnccl.so.2` (as a process using NCCL has its library mapped) and,
like NCCL, listens at NCCL_RAS_ADDR (SO_REUSEADDR, SO_REUSEPORT), in this very process
(the "rank"). It writes DIR/ready-<pid> once it listens. MODE: json (2.28.7: a 4-rank
communicator where rank 3 launched one AllReduce fewer, and a 2-rank one missing rank 1),
text (an NCCL before 2.28.7: `SET FORMAT` is an unknown command; the same hang as text),
garbage, huge (a 16 MiB report), trickle (a byte every 0.2 s), silent.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
import threading
import time
from pathlib import Path

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # NCCL_NUM_FUNCTIONS 5
VERSION = "2.28.7"


def json_report() -> str:
    out = ["{\n", f'  "nccl_version": "{VERSION}",\n', '  "cuda_runtime_version": 12080,\n',
           '  "cuda_driver_version": 12080,\n', '  "timestamp": "2026-11-29 05:10:00",\n',
           '  "communicators_count": 2,\n', '  "communicators": [\n']  # fmt: skip
    comms = [
        ("0x5a1e3c2b9d4f6071", 4, [(r, 12 if r < 3 else 11) for r in range(4)], []),
        ("0x1b2c3d4e5f607182", 2, [(0, 7)], [1]),
    ]
    for index, (hash_, size, ranks, missing) in enumerate(comms):
        if index:
            out.append(",\n")
        out += ["    {\n", f'      "hash": "{hash_}",\n',
                '      "secondary_hash": "0x9e3779b97f4a7c15:0x2545f4914f6cdd1d",\n',
                f'      "size": {size},\n', f'      "ranks_count": {len(ranks)},\n',
                f'      "missing_ranks_count": {len(missing)},\n', '      "ranks": [\n']  # fmt: skip
        for i, (rank, allreduce) in enumerate(ranks):
            if i:
                out.append(",\n")
            out += ["        {\n", f'          "rank": {rank},\n', '          "host": "10.0.0.1",\n',
                    f'          "pid": {4000 + rank},\n', f'          "cuda_dev": {rank},\n',
                    f'          "nvml_dev": {rank},\n', '          "status": {\n',
                    '            "init_state": 0,\n', '            "async_error": 0,\n',
                    '            "finalize_called": false,\n', '            "destroy_flag": false,\n',
                    '            "abort_flag": false\n', "          },\n",
                    '          "collective_counts": {\n']  # fmt: skip
            for f, name in enumerate(FUNCS):
                count = allreduce if name == "AllReduce" else 2
                out.append(
                    f'            "{name}": {count}' + ("," if f < len(FUNCS) - 1 else "") + "\n"
                )
            out += ["          }\n", "        }"]
        if missing:
            out += ["\n      ],\n", '      "missing_ranks": [\n']
            for i, rank in enumerate(missing):
                if i:
                    out.append(",\n")
                out += ["        {\n", f'          "rank": {rank},\n', '          "host": "10.0.0.2",\n',
                        f'          "pid": {5000 + rank},\n', f'          "cuda_dev": {rank},\n',
                        f'          "nvml_dev": {rank}\n',  # sic: no comma in 2.28.7
                        '          "status": {\n', '            "unresponsive": true,\n',
                        '            "considered_dead": true\n', "          }\n", "        }"]  # fmt: skip
        out += ["\n      ]\n", "    }"]
    out += ["\n  ],\n", '  "ras": {\n', '    "collection_time_sec": 0.004,\n',
            '    "timeouts_count": 0\n', "  }\n", "}\n"]  # fmt: skip
    return "".join(out)


def text_report() -> str:
    return (
        "NCCL version 2.26.6 compiled with CUDA 12.8\n"
        "CUDA runtime version 12080, driver version 12080\n\n"
        "Job summary\n===========\n\n"
        "  Nodes  Processes         GPUs\n(total)    (total)      (total)\n"
        "      1          4            4\n\n"
        "Communicators... (0.004s)\n=============\n\n"
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
        "    0         1         1         4         4         4   RUNNING  MISMATCH\n\n"
        "Errors\n======\n\n"
        "Warnings\n========\n\n"
        "#0-0 (5a1e3c2b9d4f6071) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  3 ranks have launched up to operation 12\n"
        "  Rank 0 -- GPU 0 managed by process 4000 on node 10.0.0.1\n"
        "  Rank 1 -- GPU 1 managed by process 4001 on node 10.0.0.1\n"
        "  Rank 2 -- GPU 2 managed by process 4002 on node 10.0.0.1\n"
        "  Rank 3 has launched up to operation 11 -- GPU 3 managed by process 4003 on node 10.0.0.1\n"
        "\n"
    )


def serve(conn: socket.socket, mode: str) -> None:
    with conn:
        fmt = "text"
        reader = conn.makefile("rb")
        for raw in reader:
            cmd = raw.decode().strip()
            upper = cmd.upper()
            if mode == "garbage":
                conn.sendall(bytes(range(256)) * 4 + b"\n")
                return
            if upper.startswith("CLIENT PROTOCOL "):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif upper.startswith("TIMEOUT "):
                conn.sendall(b"OK\n")
            elif upper.startswith("SET FORMAT ") and mode != "text":
                fmt = cmd[len("SET FORMAT ") :].lower()
                conn.sendall(b"OK\n")
            elif upper in ("STATUS", "VERBOSE STATUS"):
                if mode == "silent":
                    time.sleep(60)
                elif mode == "trickle":
                    for byte in text_report().encode():
                        conn.sendall(bytes([byte]))
                        time.sleep(0.2)
                elif mode == "huge":
                    conn.sendall(b"x" * (16 << 20))
                else:
                    conn.sendall((json_report() if fmt == "json" else text_report()).encode())
                return  # NCCL closes the connection once the report is sent
            else:
                conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())


def map_library(directory: Path) -> mmap.mmap:
    """A file named as NCCL's library, mapped as the dynamic loader maps it: the agent
    asks for RAS only in processes that have NCCL mapped (/proc/PID/maps)."""
    lib = directory / "lib" / "libnccl.so.2"
    lib.parent.mkdir(exist_ok=True)
    lib.write_bytes(b"stand-in for NCCL's library\n" * 256)
    with open(lib, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    library = map_library(directory)  # noqa: F841 (kept mapped while the process lives)
    host, _, port = os.environ["NCCL_RAS_ADDR"].rpartition(":")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    server.bind((host, int(port)))
    server.listen(16)
    (directory / f"ready-{os.getpid()}").write_text(port)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()
