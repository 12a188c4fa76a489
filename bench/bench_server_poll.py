"""The agent's cost of polling inference servers, as % of one core.

    python bench/bench_server_poll.py [--servers 64] [--seconds 30] [--interval 2]

One stand-in server process (tests/jobs/standin_server.py, answering the bytes SGLang's
code produces, precomputed, with `--histograms` histogram families beside the gauges so
that `/metrics` is as large as a real server's) listens on `--servers` ports. In this process, measured by
its own CPU time (the servers' CPU is theirs, not counted), one after the other, for
`--seconds` each:
- baseline: the agent's health poll before this change (`GET /health` of each server
  every 3 s with http.client and a thread per poll: the HealthPoller of the node agent);
- polling: the ServerPoller (agents/areal_node/server_poll.py) asking each server's
  `/metrics` and `/model_info` every `--interval` seconds (8 workers, one poll in flight
  per server), with the `state()` call a `sample` makes once a second.
Reported: CPU % of one core for each, polls completed, and the ratio.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from areal_node.server_poll import ServerPoller  # noqa: E402

from tests.support.fixtures.rollout_formats import ServerState, sglang_metrics  # noqa: E402


def health_baseline(ports: list[int], seconds: float, ttl: float = 3.0) -> int:
    """The pre-change agent's poll: a thread per `GET /health`, every `ttl` seconds."""
    done = 0

    def poll(port: int) -> None:
        nonlocal done
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        try:
            conn.request("GET", "/health")
            conn.getresponse().read(4096)
            done += 1
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        threads = [threading.Thread(target=poll, args=(p,), daemon=True) for p in ports]
        for t in threads:
            t.start()
        time.sleep(ttl)
    return done


def poller_run(ports: list[int], seconds: float, interval: float) -> int:
    poller = ServerPoller(interval=interval)
    targets = [("sglang", "127.0.0.1", p) for p in ports]
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            poller.state(targets)
            time.sleep(1.0)  # the agent's sample rate
        final = poller.state(targets)
    finally:
        poller.close()
    return sum(len(v.get("throughput") or []) for v in final.values())


def cpu_percent(fn, *args: object) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    c0, w0 = time.process_time(), time.monotonic()
    result = fn(*args)
    return 100 * (time.process_time() - c0) / (time.monotonic() - w0), result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--servers", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--histograms", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "jobs" / "standin_server.py"), "--kind", "sglang",
             "--listen-count", str(args.servers), "--cache", "--ready", str(ready),
             "--histograms", str(args.histograms)]
        )  # fmt: skip
        try:
            while not (ready.exists() and ready.read_text().strip()):
                time.sleep(0.05)
            ports = [int(p) for p in ready.read_text().split()]
            base, base_polls = cpu_percent(health_baseline, ports, args.seconds)
            ours, polls = cpu_percent(poller_run, ports, args.seconds, args.interval)
        finally:
            server.kill()
            server.wait()
    size = len(sglang_metrics(ServerState(histograms=args.histograms)))
    print(
        f"servers {len(ports)}, /metrics {size} bytes, {args.seconds:g} s each, poll interval {args.interval:g} s"
    )
    print(f"baseline (GET /health every 3 s): {base:.2f}% of a core, {base_polls} polls")
    print(
        f"ServerPoller (/metrics + /model_info): {ours:.2f}% of a core, {polls} polls kept in history"
    )
    print(f"ratio polling / baseline: {ours / base:.2f}" if base > 0 else "baseline used no CPU")


if __name__ == "__main__":
    main()
