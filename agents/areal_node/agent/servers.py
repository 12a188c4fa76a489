"""Inference servers (SGLang, vLLM): recognised by command line, polled at `GET /health`."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.cmdline import exe_name, flag_value, python_module
from areal_node.agent.procfs import to_int

if TYPE_CHECKING:
    from areal_node.server_poll import ServerPoller

# Inference servers: module -> (kind, default port). AReaL builds their command lines with
# `get_py_cmd(module, args)` (areal/api/cli_args.py:2007-2022, 2121, 2255); both remote
# engines check health with `GET /health` (areal/engine/sglang_remote.py:374-376,
# areal/engine/vllm_remote.py:258-260).
SERVER_MODULES = {
    "areal.v2.inference_service.sglang.launch_server": ("sglang", 30000),
    "areal.experimental.inference_service.sglang.launch_server": ("sglang", 30000),
    "areal.engine.awex.sglang_plugin": ("sglang", 30000),
    "sglang.launch_server": ("sglang", 30000),
    "areal.engine.vllm_ext.areal_vllm_server": ("vllm", 8000),
    "vllm.entrypoints.openai.api_server": ("vllm", 8000),
    # AReaL v2's data proxy in front of SGLang: its /health says paused and version
    # (areal/v2/inference_service/data_proxy/__main__.py:23-24, app.py:371-381).
    "areal.v2.inference_service.data_proxy": ("data_proxy", 8082),
}
HEALTH_PATH = "/health"
HEALTH_TIMEOUT = 1.0  # seconds per poll
HEALTH_TTL = 3.0  # a poll younger than this is reused


def server_kind(cmdline: list[str]) -> tuple[str, int] | None:
    """(kind, default port) of an inference server command line."""
    module = python_module(cmdline)
    if module in SERVER_MODULES:
        return SERVER_MODULES[module]
    if exe_name(cmdline) == "vllm" and len(cmdline) > 1 and cmdline[1] == "serve":
        return ("vllm", 8000)
    return None


def server_address(cmdline: list[str], default_port: int) -> dict[str, Any]:
    host = flag_value(cmdline, "--host")
    port = to_int(flag_value(cmdline, "--port")) or default_port
    # A server bound to every interface answers on loopback, where the agent is.
    target = {None: "127.0.0.1", "": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(
        host, host
    )
    shown = f"[{target}]" if target and ":" in target else target
    return {"host": host, "port": port, "url": f"http://{shown}:{port}{HEALTH_PATH}"}


class HealthPoller:
    """`GET /health` of inference servers, with a short timeout; answers are reused for
    HEALTH_TTL seconds and refreshed in the background, so a sample never waits on a
    server it has already asked (only a server seen for the first time costs a poll)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self._running: dict[str, threading.Thread] = {}

    @staticmethod
    def poll(url: str, timeout: float = HEALTH_TIMEOUT) -> dict[str, Any]:
        """One `GET /health` with an overall deadline (a server that trickles its answer
        a byte at a time is cut at `timeout`, not kept by a per-read timeout)."""
        import urllib.parse

        from areal_node.server_poll import http_get

        started = time.monotonic()
        result: dict[str, Any] = {"ok": False, "status": None, "error": None}
        try:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname or "", parts.port
        except ValueError as exc:  # a malformed address: said, never raised
            host, port, result["error"] = "", None, f"bad server address: {exc}"
        if port is not None:
            answer = http_get(host, port, parts.path or "/", started + timeout, max_bytes=1 << 16)
            result["status"] = answer.status
            result["ok"] = answer.status == 200 and answer.error is None
            if answer.error is not None:
                if answer.error.startswith("connection refused"):
                    result["error"] = "connection refused (nothing listens on that port)"
                elif answer.error.startswith("no complete answer"):
                    result["error"] = f"no answer within {timeout:g}s"
                else:
                    result["error"] = answer.error
            elif not result["ok"]:
                result["error"] = f"HTTP {answer.status}"
        elif result["error"] is None:
            result["error"] = "no port to ask"
        result["latency_ms"] = round(1000 * (time.monotonic() - started), 1)
        result["checked_at"] = time.time()
        return result

    def _refresh(self, url: str) -> None:
        result = self.poll(url)
        with self._lock:
            self._cache[url] = dict(result, _mono=time.monotonic())
            self._running.pop(url, None)

    def health(self, urls: list[str]) -> dict[str, dict[str, Any]]:
        """The latest answer of each URL (first-time URLs are polled now, in parallel)."""
        now = time.monotonic()
        waits = []
        with self._lock:
            for url in set(urls):
                cached = self._cache.get(url)
                if (cached is None or now - cached["_mono"] > HEALTH_TTL) and (
                    url not in self._running
                ):
                    thread = threading.Thread(
                        target=self._refresh, args=(url,), name="health", daemon=True
                    )
                    self._running[url] = thread
                    thread.start()
                if cached is None:
                    waits.append(self._running[url])
        # One deadline for all of them: twenty slow servers cost one timeout, not twenty.
        deadline = time.monotonic() + HEALTH_TIMEOUT + 1.0
        for thread in waits:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return {
                url: {k: v for k, v in self._cache[url].items() if k != "_mono"}
                for url in urls
                if url in self._cache
            }


VERIFY_TTL = 10.0  # seconds a server's verified listening port is reused


class ServerStates:
    """What the node's inference servers say, asked only at a port their own process
    listens on (agents/areal_node/server_poll.py): `GET /health` (as before, its answer
    under `health`), and in the background their metrics, weight version, pause state
    and flags. A server whose port is not verified is not asked; `health` says why."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self.health = HealthPoller()
        # Started with the first server seen: an agent on a node without one (a one-shot
        # stacks capture, a trainer-only node) neither imports the HTTP poller nor starts
        # its threads.
        self._poller: ServerPoller | None = None
        self._poller_lock = threading.Lock()
        self._verified: dict[tuple[int, int], tuple[float, Any, str]] = {}

    @property
    def poller(self) -> ServerPoller:
        """The background poller, started on first use."""
        with self._poller_lock:
            if self._poller is None:
                from areal_node.server_poll import ServerPoller

                self._poller = ServerPoller()
            return self._poller

    def close(self) -> None:
        with self._poller_lock:
            if self._poller is not None:
                self._poller.close()

    def _verify(self, pid: int, port: int) -> tuple[Any, str]:
        from areal_node.server_poll import verified_endpoint

        now = time.monotonic()
        hit = self._verified.get((pid, port))
        if hit is not None and now - hit[0] < VERIFY_TTL:
            return hit[1], hit[2]
        endpoint, why = verified_endpoint(pid, port, self.proc_root)
        if len(self._verified) > 4096:
            self._verified.clear()
        self._verified[(pid, port)] = (now, endpoint, why)
        return endpoint, why

    def attach(self, records: list[dict[str, Any]]) -> None:
        """Fill `health` and the polled state of each record's `server`."""
        from areal_node.server_poll import POLL_DEADLINE, attach_state

        # A server seen for the first time is waited for (one deadline), as /health was.
        verified = attach_state(records, self.poller, self._verify, wait_first=POLL_DEADLINE + 0.5)
        urls: dict[int, str] = {}
        for rec in records:
            srv = rec.get("server")
            if not isinstance(srv, dict):
                continue
            listener = verified.get(id(srv))
            if listener is None:
                srv["health"] = {
                    "ok": False,
                    "status": None,
                    "error": srv.get("poll_error") or "not polled",
                    "latency_ms": None,
                    "checked_at": time.time(),
                }
                continue
            shown = f"[{listener.host}]" if ":" in listener.host else listener.host
            urls[id(srv)] = f"http://{shown}:{listener.port}{HEALTH_PATH}"
        answers = self.health.health(list(urls.values())) if urls else {}
        for rec in records:
            srv = rec.get("server")
            if isinstance(srv, dict) and id(srv) in urls:
                srv["health"] = answers.get(urls[id(srv)])
