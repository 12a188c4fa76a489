"""Stand-in for `python -m areal.v2.inference_service.data_proxy --host H --port P` (tests
only): answers `GET /health` with the body of AReaL's DataProxyHealthResponse
(areal/v2/inference_service/data_proxy/app.py:62-67, :371-381 at cbff54d), paused or not
(STUB_PAUSED=1) at version STUB_VERSION, through tests/jobs/standin_server.py (found
through STUB_TESTS_ROOT, the repository root)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8082)
    args, _ = parser.parse_known_args()
    root = os.environ["STUB_TESTS_ROOT"]
    sys.argv = [
        "standin_server.py", "--kind", "data_proxy", "--host", args.host, "--port", str(args.port),
        "--version", os.environ.get("STUB_VERSION", "0"),
    ] + (["--paused"] if os.environ.get("STUB_PAUSED") == "1" else [])  # fmt: skip
    runpy.run_path(os.path.join(root, "tests", "jobs", "standin_server.py"), run_name="__main__")


if __name__ == "__main__":
    main()
