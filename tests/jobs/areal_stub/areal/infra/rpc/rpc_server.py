"""Stand-in for `python -m areal.infra.rpc.rpc_server` (tests only).

As AReaL's worker (areal/infra/rpc/rpc_server.py, guard/app.py, guard/engine_blueprint.py
at cbff54d6): the same arguments (guard/app.py:495-533), `GET /health` (app.py:180),
`POST /set_env` putting RANK, WORLD_SIZE, MASTER_* into os.environ only (app.py:418-447),
so never into /proc/PID/environ; engine calls run in one thread named `EngineWorker`
(engine_blueprint.py:141-181) while the HTTP request thread waits on a future. The engine
here is a gloo job: every rank all_reduces once, then all but the last wait in a barrier.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_work: queue.Queue[tuple[Any, Future[Any]]] = queue.Queue()


def engine_worker() -> None:
    while True:
        func, future = _work.get()
        try:
            future.set_result(func())
        except Exception as exc:  # reported to the caller, as AReaL does
            future.set_exception(exc)


def _submit_to_engine_thread(func: Any) -> Any:
    future: Future[Any] = Future()
    _work.put((func, future))
    return future.result()


def slow_step() -> None:
    while True:
        time.sleep(3600)


def train_batch(ready_file: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.ones(4)
    dist.all_reduce(value)
    with open(ready_file, "w") as fh:
        fh.write(f"{rank} {value.sum().item()}\n")
    if rank == world - 1:
        slow_step()
    dist.barrier()


def launch_server(args: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal.v2.inference_service.sglang.launch_server", *args],
        env={**os.environ, **env},
    )
    return proc.pid


def update_weights(log_dir: str, ready_file: str) -> None:
    from areal.engine.fsdp_engine import FSDPEngine

    FSDPEngine().update_weights(log_dir, ready_file)


def launch_data_proxy(args: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal.v2.inference_service.data_proxy", *args],
        env={**os.environ, **env},
    )
    return proc.pid


ENGINE = {
    "train_batch": train_batch,
    "launch_server": launch_server,
    "update_weights": update_weights,
    "launch_data_proxy": launch_data_proxy,
}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "healthy"})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/set_env":
            for key, value in body["env"].items():
                os.environ[key] = str(value)
            self._reply(200, {"status": "success"})
        elif self.path == "/call":
            func = ENGINE[body["method"]]
            kwargs = body.get("kwargs") or {}
            result = _submit_to_engine_thread(lambda: func(**kwargs))
            self._reply(200, {"status": "success", "result": result})
        else:
            self._reply(404, {"error": "not found"})


def register(args: argparse.Namespace, host: str, port: int) -> None:
    """As run_server does (guard/app.py:565-571, 618-625): the index from SLURM_PROCID when
    set, the key from names.worker_discovery, the value `host:port`, written as
    NfsNameRecordRepository.add writes it (name_resolve.py:301-328: ENTRY.tmp.<id>, rename)."""
    import getpass
    import uuid

    index = int(os.environ.get("SLURM_PROCID", args.worker_index))
    name = (
        f"{getpass.getuser()}/{args.experiment_name}/{args.trial_name}/workers/{args.role}/{index}"
    )
    path = os.path.join(args.nfs_record_root, os.path.normpath(name), "ENTRY")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + f".tmp.{str(uuid.uuid4())[:8]}"
    with open(tmp, "w") as f:
        f.write(f"{host}:{port}")
    os.rename(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description="AReaL Sync RPC Server (stand-in)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", type=str, default="0.0.0.0")
    parser.add_argument("--experiment-name", type=str, required=True)
    parser.add_argument("--trial-name", type=str, required=True)
    parser.add_argument("--role", type=str, required=True)
    parser.add_argument("--worker-index", type=int, default=-1)
    parser.add_argument("--name-resolve-type", type=str, default="nfs")
    parser.add_argument("--nfs-record-root", type=str, default="/tmp/areal/name_resolve")
    parser.add_argument("--etcd3-addr", type=str, default="localhost:2379")
    parser.add_argument("--fileroot", type=str, default=None)
    args, _ = parser.parse_known_args()
    threading.Thread(target=engine_worker, daemon=True, name="EngineWorker").start()
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host  # tests: loopback
    server = ThreadingHTTPServer((host, args.port), Handler)
    server.daemon_threads = True
    if os.environ.get("AREAL_STUB_REGISTER") and args.name_resolve_type == "nfs":
        register(args, host, server.server_address[1])
    print(f"worker {args.role}/{args.worker_index} serving on {host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
