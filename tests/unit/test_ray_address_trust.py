"""Whom we talk to: `--ray` without an address reads the file `ray start` leaves in /tmp,
which any local user can create first. It is read only through the guarded reader (a
regular file of root or this user, no link, no blocking, 4 KB), so another user's FIFO
there is an error at once (it hung `nodes --ray` past every timeout), and an address
another user wrote there never receives the Ray token (`Authorization: Bearer ...`).

The file's path is the module's constant, pointed at a shared folder here (the real
/tmp/ray belongs to the Ray test cluster)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nobody import as_nobody, needs_nobody, shared_tmp

TOKEN = "ray-token-0123456789abcdef"
NODES_RAY = """
import sys
from areal_console.core.ray import nodes
from areal_console.cli import main
nodes.CURRENT_CLUSTER_FILE = sys.argv[1]
sys.exit(main(["nodes", "--ray", "--json"]))
"""


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:
        Recorder.seen.append(self.headers.get("Authorization"))
        body = b'{"result": true, "data": {"result": {"result": [], "total": 0}}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def dashboard() -> Iterator[str]:
    """A stand-in dashboard on this engineer's loopback range that records the
    Authorization header of each request."""
    server = http.server.ThreadingHTTPServer(("127.0.12.1", 0), Recorder)
    Recorder.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.12.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def nodes_ray(cluster_file: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_TOKEN": TOKEN}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", NODES_RAY, str(cluster_file)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@needs_nobody
def test_a_fifo_planted_as_the_cluster_file_is_an_error_at_once() -> None:
    with shared_tmp() as shared:
        fifo = shared / "ray_current_cluster"
        as_nobody("mkfifo", str(fifo))
        result = nodes_ray(fifo)  # hung here before: the timeout fails the test
    assert result.returncode == 1, result.stderr
    assert "not a regular file" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@needs_nobody
def test_an_address_another_user_wrote_never_gets_the_token(dashboard: str) -> None:
    with shared_tmp() as shared:
        planted = shared / "ray_current_cluster"
        as_nobody("sh", "-c", f"printf %s {dashboard} > {planted}")
        result = nodes_ray(planted)
    assert result.returncode == 1, result.stderr
    assert "not by this user or root" in result.stderr
    assert Recorder.seen == []  # no request at all, so no token


def test_an_address_this_user_wrote_gets_the_token(dashboard: str, tmp_path: Path) -> None:
    """The stand-in sees the header when the rule allows it (the check above can fail)."""
    own = tmp_path / "ray_current_cluster"
    own.write_text(dashboard)
    nodes_ray(own)
    assert f"Bearer {TOKEN}" in Recorder.seen


# Modules that put a credential on the wire, each reviewed: their addresses come from
# `core/ray/nodes.py: parse_address` (the user's --ray, RAY_ADDRESS, RAY_DASHBOARD_ADDRESS,
# or the cluster file when root or this user wrote it).
SENDS_CREDENTIALS = {"core/ray/nodes.py", "core/ray/versions.py", "core/ray/ranks.py"}


def test_credentials_are_sent_only_from_reviewed_modules() -> None:
    ui = Path(__file__).resolve().parents[2] / "tui" / "areal_console"
    node = Path(__file__).resolve().parents[2] / "agents" / "areal_node"
    senders = {
        str(p.relative_to(ui)) if p.is_relative_to(ui) else str(p)
        for p in [*ui.rglob("*.py"), *node.rglob("*.py")]
        if "Authorization" in p.read_text() and p.name != "redact.py"  # redact masks it
    }
    assert senders == SENDS_CREDENTIALS
