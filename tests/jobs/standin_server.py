"""A stand-in inference server: answers `/metrics`, `/model_info` and `/health` with the
bytes SGLang's, vLLM's and AReaL's data proxy's code produce (tests/support/fixtures/rollout_formats.py),
or misbehaves on purpose.

    python tests/jobs/standin_server.py --kind sglang|vllm|data_proxy --port P
        [--host 127.0.0.1] [--mode normal|slow|trickle|truncated|oversized|hostile|odd_versions|garbage]
        [--paused] [--dev-mode] [--version N] [--throughput T] [--ready FILE]
        [--token-usage U] [--queue-growth Q] [--throughput-drop-after K]

It writes FILE once it listens (the port, useful with --port 0).
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.fixtures.rollout_formats import (
    ServerState,
    data_proxy_health,
    sglang_metrics,
    sglang_model_info,
    vllm_is_paused,
    vllm_metrics,
)


def body_for(kind: str, path: str, state: ServerState) -> bytes | None:
    if path == "/metrics" and kind == "sglang":
        return sglang_metrics(state)
    if path == "/metrics" and kind == "vllm":
        return vllm_metrics(state)
    if path == "/model_info" and kind == "sglang":
        return sglang_model_info(state)
    if path == "/is_paused" and kind == "vllm" and state.dev_mode:
        return vllm_is_paused(state)
    if path == "/health" and kind == "data_proxy":
        return data_proxy_health(state)
    if path == "/health":
        return b""
    return None


def answer(conn: socket.socket, args: argparse.Namespace, state: ServerState) -> None:
    conn.settimeout(5)
    request = b""
    while b"\r\n\r\n" not in request and len(request) < 65536:
        data = conn.recv(4096)
        if not data:
            return
        request += data
    path = request.split(b" ", 2)[1].decode("latin-1") if request.count(b" ") >= 2 else "/"
    with open(args.log, "a") if args.log else open("/dev/null", "a") as log:
        log.write(path + "\n")
    body = body_for(args.kind, path, state)
    if body is None:
        conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        return
    state.generation_tokens += 1000  # vLLM's counter moves between polls
    if path == "/metrics":
        state.queued += args.queue_growth  # a queue that grows with every poll
        args.metrics_polls += 1
        if args.throughput_drop_after and args.metrics_polls > args.throughput_drop_after:
            state.throughput = args.throughput / 10  # generation slows to a tenth
    ctype = (
        b"application/json" if path != "/metrics" else b"text/plain; version=0.0.4; charset=utf-8"
    )
    head = b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: %d\r\n\r\n"
    mode = args.mode
    if mode == "slow":
        time.sleep(30)
    if mode == "trickle":
        for byte in (head % len(body)) + body:
            conn.sendall(bytes([byte]))
            time.sleep(0.3)
        return
    if mode == "truncated":
        conn.sendall((head % len(body)) + body[: len(body) // 2])
        return
    if mode == "oversized":
        big = body * (64 * 1024 * 1024 // max(1, len(body)) + 1)
        conn.sendall(head % len(big))
        try:
            conn.sendall(big)
        except OSError:
            pass
        return
    if mode == "hostile":
        evil = (
            b'sglang:num_running_reqs{model_name="\x1b]2;pwned\x07\x1b[2J"} 1e308\n'
            b"sglang:num_queue_reqs{" + b'a="' * 5000 + b"} 3\n"
            b'sglang:token_usage{tp_rank="0"} NaN\n'
            b"sglang:gen_throughput 1_000\n" + b"#" * 100000 + b"\n"
        )
        if path == "/model_info":
            evil = b"[" * 100000
        elif path == "/health":
            evil = b'{"paused": "yes", "version": 123456789012345678901234567890}'
        conn.sendall((head % len(evil)) + evil)
        return
    if mode == "odd_versions":  # JSON of the right shape with values no server sends
        evil = {"/model_info": b'{"weight_version": "\\u00b2\\u001b]2;pwned\\u0007"}', "/health":
                b'{"paused": 1, "version": -5}', "/is_paused": b'{"is_paused": "false"}'}.get(
            path, body)  # fmt: skip
        conn.sendall((head % len(evil)) + evil)
        return
    if mode == "garbage":
        conn.sendall(b"\x00\xff garbage with no header end" * 10)
        return
    conn.sendall((head % len(body)) + body)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="sglang")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mode", default="normal")
    ap.add_argument("--paused", action="store_true")
    ap.add_argument("--dev-mode", action="store_true", help="vLLM: answer GET /is_paused")
    ap.add_argument("--version", type=int, default=0)
    ap.add_argument("--throughput", type=float, default=1800.0)
    ap.add_argument("--token-usage", type=float, default=0.35, help="KV cache share in use")
    ap.add_argument(
        "--queue-growth", type=float, default=0.0, help="queued requests added per /metrics"
    )
    ap.add_argument(
        "--throughput-drop-after",
        type=int,
        default=0,
        help="after this many /metrics answers, a tenth of --throughput",
    )
    ap.add_argument("--ready")
    ap.add_argument("--log")
    ap.add_argument("--histograms", type=int, default=0, help="extra histogram families")
    ap.add_argument("--listen-count", type=int, default=1, help="ports to listen on (bench)")
    ap.add_argument("--cache", action="store_true", help="answer precomputed bodies (bench)")
    args = ap.parse_args()
    args.metrics_polls = 0
    state = ServerState(
        paused=args.paused,
        proxy_version=args.version,
        weight_version=str(args.version),
        throughput=args.throughput,
        token_usage=args.token_usage,
        histograms=args.histograms,
        dev_mode=args.dev_mode,
    )
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    servers = []
    for i in range(args.listen_count):
        srv = socket.socket(family, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((args.host, args.port if i == 0 else 0))
        srv.listen(64)
        servers.append(srv)
    if args.cache:
        cached: dict[tuple[str, str], bytes | None] = {}

        def cached_body(kind: str, path: str, state: ServerState) -> bytes | None:
            if (kind, path) not in cached:
                cached[(kind, path)] = uncached(kind, path, state)
            return cached[(kind, path)]

        global body_for
        uncached, body_for = body_for, cached_body
    if args.ready:
        Path(args.ready).write_text(" ".join(str(srv.getsockname()[1]) for srv in servers))

    def accept(srv: socket.socket) -> None:
        while True:
            conn, _ = srv.accept()

            def serve(c: socket.socket = conn) -> None:
                with c:
                    try:
                        answer(c, args, state)
                    except OSError:
                        pass

            threading.Thread(target=serve, daemon=True).start()

    for srv in servers[1:]:
        threading.Thread(target=accept, args=(srv,), daemon=True).start()
    accept(servers[0])


if __name__ == "__main__":
    main()
