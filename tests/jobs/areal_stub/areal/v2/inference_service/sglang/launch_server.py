"""Stand-in for `python3 -m areal.v2.inference_service.sglang.launch_server --host H --port
P ...` (tests only): answers `GET /health` as SGLang's HTTP server does (AReaL's remote
engine asks that path: areal/engine/sglang_remote.py:374-376 at cbff54d6). With
STUB_HEALTH=unhealthy it answers 503, with STUB_HEALTH=hang it accepts and never answers,
with STUB_HEALTH=dead it never listens (a server still loading, or wedged). With
STUB_HEALTH=metrics it is tests/jobs/standin_server.py (SGLang's `/metrics` bytes; found
through STUB_TESTS_ROOT), its KV cache STUB_TOKEN_USAGE full, its queue growing by
STUB_QUEUE_GROWTH requests a poll and, after STUB_THROUGHPUT_DROP_AFTER polls, its
throughput down to a tenth."""

from __future__ import annotations

import argparse
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODE = os.environ.get("STUB_HEALTH", "healthy")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if MODE == "hang":
            time.sleep(3600)
        code = 200 if MODE == "healthy" and self.path == "/health" else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args, _ = parser.parse_known_args()
    if MODE == "metrics":
        import runpy
        import sys

        sys.argv = ["standin_server.py", "--kind", "sglang", "--host", args.host, "--port",
                    str(args.port), "--token-usage", os.environ.get("STUB_TOKEN_USAGE", "0.35"),
                    "--queue-growth", os.environ.get("STUB_QUEUE_GROWTH", "0"),
                    "--throughput-drop-after", os.environ.get("STUB_THROUGHPUT_DROP_AFTER", "0")]  # fmt: skip
        root = os.environ["STUB_TESTS_ROOT"]
        runpy.run_path(
            os.path.join(root, "tests", "jobs", "standin_server.py"), run_name="__main__"
        )
        return
    if MODE == "dead":
        while True:
            time.sleep(3600)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
